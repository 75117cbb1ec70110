// A TF Env whose local files are written and read with O_DIRECT, for the
// streaming checkpoint ops (checkpoint_kernels.cc) and the table file ops
// (file_kernels.cc).
//
// Why: a checkpoint of a 10M-key Adam state is 2.2 GB. Written through the
// page cache, those bytes first become 2.2 GB of new cache memory, which the
// kernel must find, zero and map (on the VM the benchmarks run on that took
// 2-5 s of system time per save, more than the write itself), and which then
// pushes out memory other processes use; once dirty pages pass the kernel's
// threshold, the writer is throttled to the disk's speed anyway. Direct I/O
// moves the bytes from our buffer to the disk: a save costs what the disk
// takes, and a restore reads the files at the disk's speed without filling
// the cache (where it had just been written buffered, the cache was warm;
// with direct writes it never is, so reads are direct too).
//
// Paths with a scheme (gs://, s3://, hdfs://, ram://) go to their file
// system unchanged, and so does any local file system that refuses O_DIRECT
// (tmpfs, some FUSE mounts): open() tells, and the buffered file is used.
// DYNEMB_DIRECT_IO=0 in the environment turns direct I/O off.

#ifndef DYNEMB_KERNELS_DIRECT_IO_H_
#define DYNEMB_KERNELS_DIRECT_IO_H_

#include "tensorflow/core/platform/env.h"

namespace dynemb {

// The Env the checkpoint ops hand BundleWriter and BundleReader, and the file
// ops use: direct I/O for local files (see above), Env::Default() itself when
// DYNEMB_DIRECT_IO=0.
// Lives as long as the process.
tensorflow::Env* CheckpointEnv();

}  // namespace dynemb

#endif  // DYNEMB_KERNELS_DIRECT_IO_H_
