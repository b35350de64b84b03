// Fault injection for recovery tests: with SYNCOPATE_CRASH_AT=<what>:<phase>:<step> in the
// environment, the process kills itself (SIGKILL: no destructor, no flush, as a power cut or the
// OOM killer would) when it reaches crash_point(what, phase, step). Without the variable a call
// is one cached comparison. Used at every phase of a checkpoint write (worker/checkpoint,
// server shards), so that tests can prove a crash at any of them is recovered from.
#pragma once
#include <cstdint>

namespace syncopate {

void crash_point(const char* what, const char* phase, int64_t step);

// The same with SYNCOPATE_FAIL_AT=<what>:<phase>:<step>: true where the caller must fail (throw),
// as a replica does when its backward runs out of memory. Without the variable, one comparison.
bool fail_point(const char* what, const char* phase, int64_t step);

}  // namespace syncopate
