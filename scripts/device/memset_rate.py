"""Times cudaMemsetAsync of the sm_90a backward's fp32 dQ accumulator (T x 64 heads x 128 x 4
bytes), the one step of the backward's pre/post work that ncu cannot time (it profiles kernels
only). Usage: python3 memset_rate.py [T ...] (default 12288, every development row's T)."""
import ctypes
import glob
import os
import sys

import torch


def cudart():
    roots = [os.path.dirname(torch.__file__)] + sys.path + ["/usr/local/cuda/lib64"]
    for root in roots:
        hits = sorted(glob.glob(os.path.join(root, "**/libcudart.so*"), recursive=True))
        if hits:
            return ctypes.CDLL(hits[-1])
    raise SystemExit("libcudart not found")


def main():
    lib = cudart()
    lib.cudaMemsetAsync.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p]
    for t in [int(a) for a in sys.argv[1:]] or [12288]:
        n = t * 64 * 128
        x = torch.empty(n, dtype=torch.float32, device="cuda")
        stream = torch.cuda.current_stream().cuda_stream
        times = []
        for i in range(25):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            rc = lib.cudaMemsetAsync(ctypes.c_void_p(x.data_ptr()), 0, n * 4, ctypes.c_void_p(stream))
            b.record()
            b.synchronize()
            if rc != 0:
                raise SystemExit(f"cudaMemsetAsync returned {rc}")
            if i >= 5:
                times.append(a.elapsed_time(b))
        times.sort()
        ms = times[len(times) // 2]
        print(f"memset T={t}: {n * 4 / 2**20:.0f} MiB, median {ms * 1e3:.1f} us, {n * 4 / ms / 1e9:.2f} TB/s")


if __name__ == "__main__":
    main()
