"""How tables and variables persist: checkpoint hooks and the streaming
`tf.train.Checkpoint` saver (checkpoint.py), file saves and loads with their
generations and manifests (files.py), and `de.FileSystemSaver` (file_saver.py)."""

from tensorflow_dynemb.persistence.file_saver import FileSystemSaver, FileSystemSaverConfig

__all__ = ["FileSystemSaver", "FileSystemSaverConfig"]
