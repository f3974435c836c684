// The CUDA implementations of the model- and vision-level interfaces (model::TextDecoder,
// vision::VisionEncoder) on the zest CUDA kernels: src/backend/cuda/ when zest is built with CUDA, else
// src/backend/stub/, whose factories answer kUnsupported with the reason.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "model/decoder.h"
#include "model/parallel.h"
#include "vision/encoder.h"

namespace zest::model {

// The CUDA decoder for a checkpoint (weights uploaded as bf16; block-wise FP8 weights dequantized to bf16 at load,
// as no kernel reads FP8 yet); kUnsupported when zest was built without CUDA or no GPU is usable.
Result<std::unique_ptr<TextDecoder>> make_cuda_decoder(const io::SafeTensors& st, const io::ModelConfig& cfg,
                                                       const DeviceDecodeOptions& opts = {},
                                                       const ParallelOptions& parallel = {});

// The CUDA decoder from collected weights (src/backend/cuda/cuda_decoder.cu, or its stub).
Result<std::unique_ptr<TextDecoder>> create_cuda_decoder(const DecoderWeights& weights,
                                                         const DeviceDecodeOptions& opts = {});

// CUDA IPC of a KV snapshot between two processes on one GPU (prefill/decode disaggregation without a copy through
// the host). export: the IPC handle (hex) of a device snapshot made by a CUDA KV cache (KvSnapshot::device_data, its
// own allocation). import: opens `handle_hex` (exported by another process on this GPU), copies the snapshot's
// `geometry.expected_bytes()` into a device snapshot of this process and closes the handle. kUnsupported without
// CUDA; kInvalidArgument for a malformed handle; kInternal naming the CUDA error otherwise (another GPU, the
// exporting process gone).
Result<std::string> cuda_ipc_export(const KvSnapshot& device_snapshot);
Result<KvSnapshot> cuda_ipc_import(const std::string& handle_hex, const KvSnapshot& geometry);

// NCCL communicators for the ranks of a parallel decoder on GPUs of this host, rank r on devices[r]: all-reduces on
// the device, queued on the decoder's stream (Communicator::all_reduce_sum_device; src/backend/cuda/parallel.cpp),
// each only once every rank's host thread is about to queue its own (model::GatedDeviceGroup: a rank that fails
// first releases the others with an error), with NVLink SHARP off unless NCCL_NVLS_ENABLE is set; libnccl.so.2 is
// loaded at the first call. kUnsupported without
// CUDA or NCCL; kInvalidArgument for fewer than two devices, a device twice or one that does not exist; kInternal
// naming NCCL's error otherwise.
Result<std::unique_ptr<CommunicatorGroup>> create_nccl_group(const std::vector<int>& devices);

// The CUDA decoder split over the GPUs of this host (--tensor-parallel N [--expert-parallel]): rank r a CUDA decoder
// on GPU r holding its shard (shard_decoder_weights), joined by NCCL, behind one model::ParallelDecoder; world 1
// without expert parallelism is create_cuda_decoder. kInvalidArgument for fewer GPUs than ranks and for sizes the
// plan does not split (plan_parallel).
// `group`: the ranks' communicators (null: NCCL over the GPUs; a benchmark may pass one that skips the sums).
Result<std::unique_ptr<TextDecoder>> create_cuda_parallel_decoder(const DecoderWeights& w, const ParallelOptions& par,
                                                                  const DeviceDecodeOptions& opts = {},
                                                                  std::unique_ptr<CommunicatorGroup> group = nullptr);

}  // namespace zest::model

namespace zest::vision {

// The CUDA bf16 encoder of the tower under `prefix` (weights uploaded to the current device); kUnsupported
// when zest was built without CUDA or no GPU is usable.
Result<std::unique_ptr<VisionEncoder>> make_cuda_vision_encoder(const io::SafeTensors& weights,
                                                                const io::VisionConfig& cfg,
                                                                const std::string& prefix = "model.visual.");

// The CUDA encoder from tensors read through `source` (src/backend/cuda/vision_encoder.cu, or its stub).
Result<std::unique_ptr<VisionEncoder>> create_cuda_vision_encoder(const io::VisionConfig& cfg,
                                                                  const VisionTensorSource& source);

}  // namespace zest::vision
