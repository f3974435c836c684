# limit: 60
# Where the fused decode routing kernel (moe_route) spends its time at batch 8 and 1: per-instruction warp stall
# samples at the finest sampling interval (bench/gpu/profile.sh's NCU_SOURCE mode).
NCU_ONLY=1 NCU_SOURCE=moe_route_kernel NCU_BATCH=8 NCU_SAMPLING=0 bash bench/gpu/profile.sh
NCU_ONLY=1 NCU_SOURCE=moe_route_kernel NCU_BATCH=1 NCU_SAMPLING=0 bash bench/gpu/profile.sh
