#include "kernels/cuda/graph_edges.h"

#include <mutex>
#include <unordered_set>
#include <vector>

#include "kernels/cuda/common.cuh"

namespace zest::cuda {

namespace {

std::mutex& kept_mutex() {
  static std::mutex m;
  return m;
}
std::unordered_set<const void*>& kept_kernels() {
  static auto* s = new std::unordered_set<const void*>();
  return *s;
}

bool edge_kept(cudaGraphNode_t to) {
  cudaKernelNodeParams kp = {};
  if (cudaGraphKernelNodeGetParams(to, &kp) != cudaSuccess) {
    cudaGetLastError();
    return true;  // not a kernel node we can inspect: leave the edge alone
  }
  std::lock_guard<std::mutex> lock(kept_mutex());
  return kept_kernels().count(kp.func) != 0;
}

}  // namespace

void keep_programmatic_edges_into(const void* kernel) {
  std::lock_guard<std::mutex> lock(kept_mutex());
  kept_kernels().insert(kernel);
}

Status launch_order_edges(cudaGraph_t graph, size_t* changed) {
  if (changed) *changed = 0;
  size_t n = 0;
  ZEST_RETURN_IF_ERROR(cuda_status(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &n), "graph edges"));
  if (n == 0) return Status::ok();
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> data(n);
  ZEST_RETURN_IF_ERROR(cuda_status(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &n), "graph edges"));
  std::vector<cudaGraphNode_t> sel_from, sel_to;
  std::vector<cudaGraphEdgeData> old_data, new_data;
  for (size_t i = 0; i < n; ++i) {
    if (data[i].type != cudaGraphDependencyTypeProgrammatic || data[i].from_port != cudaGraphKernelNodePortProgrammatic ||
        edge_kept(to[i]))
      continue;
    sel_from.push_back(from[i]);
    sel_to.push_back(to[i]);
    old_data.push_back(data[i]);
    cudaGraphEdgeData d = data[i];
    d.from_port = cudaGraphKernelNodePortLaunchCompletion;
    new_data.push_back(d);
  }
  if (sel_from.empty()) return Status::ok();
  ZEST_RETURN_IF_ERROR(cuda_status(
      cudaGraphRemoveDependencies(graph, sel_from.data(), sel_to.data(), old_data.data(), sel_from.size()),
      "remove programmatic edges"));
  ZEST_RETURN_IF_ERROR(cuda_status(
      cudaGraphAddDependencies(graph, sel_from.data(), sel_to.data(), new_data.data(), sel_from.size()),
      "add launch-order edges"));
  if (changed) *changed = sel_from.size();
  return Status::ok();
}

}  // namespace zest::cuda
