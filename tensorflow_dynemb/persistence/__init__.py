"""How tables and variables persist: checkpoint hooks and the streaming
`tf.train.Checkpoint` saver (checkpoint.py)."""
