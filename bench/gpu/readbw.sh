# limit: 120
# How fast HBM is read, by access pattern, alone on the GPU (bench/read_probe.cu: register loads by contiguous
# range or grid-stride, bulk-copy rings of several shapes; 622 MB and 50 MB bursts). Needs nvcc, not the package:
# it also runs directly, `bash bench/gpu/readbw.sh`.
set -e
cd "$(dirname "$0")/../.."
/usr/local/cuda/bin/nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a bench/read_probe.cu -o /tmp/read_probe
timeout 100 /tmp/read_probe
