// Running out of memory inside the core: a std::bad_alloc becomes a Status.
//
// The core's calls return errors; they must not throw. A std::bad_alloc that
// leaves a TF op's Compute (or a thread pool's worker) ends the process, and
// a table that runs out of memory must instead keep what it held and say so
// (docs/tables.md, "Running out of memory"). So the calls that allocate run
// their body under CatchOutOfMemory, with an error made while memory was
// still there: returning a copy of a Status allocates nothing (table.h), where
// building a message in the handler could throw again.

#ifndef DYNEMB_CORE_OUT_OF_MEMORY_H_
#define DYNEMB_CORE_OUT_OF_MEMORY_H_

#include <exception>
#include <new>

#include "cc/core/table.h"

namespace dynemb {

// Runs body(), which returns a Status; a std::bad_alloc becomes `error`.
//
// A thread's first throw allocates its C++ exception state (libstdc++'s
// thread-local data, allocated lazily where libstdc++ was loaded by dlopen, as
// under Python). If that allocation fails, as it does when the throw is a
// bad_alloc, glibc ends the process ("cannot allocate memory for thread-local
// data"), so no catch could help. std::uncaught_exceptions() reads that state,
// so calling it on entry allocates it while memory is still there.
template <typename Body>
Status CatchOutOfMemory(const Status& error, Body&& body) {
  // volatile: the call is declared pure, and an unused result would drop it.
  volatile int touch_exception_state = std::uncaught_exceptions();
  (void)touch_exception_state;
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return error;
  }
}

}  // namespace dynemb

#endif  // DYNEMB_CORE_OUT_OF_MEMORY_H_
