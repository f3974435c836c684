// Captured decode graphs with their programmatic edges moved to the launch-completion port
// (DecodeOption::kEarlyTrigger 2).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "core/status.h"

namespace zest::cuda {

// Every programmatic edge of `graph` (a kernel launched with programmatic stream serialisation after another
// kernel) fires once all blocks of the upstream kernel have begun, instead of once they have all passed
// griddepcontrol.launch_dependents (which zest's kernels issue right after their own wait). A kernel's prologue, the
// work before its griddepcontrol.wait (weight and KV copies; nothing another kernel of the stream writes), may then
// run beside the kernel two back. The downstream wait still orders each kernel after the upstream kernel's
// completion and memory flush. Edges into kernels registered with keep_programmatic_edges_into stay as they are.
// `changed` (optional) gets the number of edges moved.
Status launch_order_edges(cudaGraph_t graph, size_t* changed = nullptr);

// Registers a kernel whose work before its griddepcontrol.wait reads what the kernel two back wrote (valid only
// while the kernel before it triggers its dependents after its own wait): edges into it keep the programmatic port.
void keep_programmatic_edges_into(const void* kernel);

}  // namespace zest::cuda
