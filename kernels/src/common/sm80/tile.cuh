// Shared-memory tiles of the sm_80 path (filled by cp.async, read by ldmatrix): bf16 rows with
// 128 columns (256 bytes), the one tile shape of the mma kernels: K and V blocks
// [128 keys][128 d], Q and dO slabs [rows][128 d], P and dS [rows][128 keys].
//
// Swizzle: a row is 16 chunks of 16 bytes and chunk c of row r is stored at chunk c ^ (r % 8).
// Rows are 256 bytes apart, so every row starts at bank 0; the XOR spreads the 8 rows that one
// ldmatrix phase reads (8 consecutive rows, same logical chunk) over 8 distinct 16-byte bank
// groups, and the 8 chunks one quarter-warp stores with cp.async (one row, chunks 8j..8j+7) stay
// a permutation of one 128-byte line. Both sides therefore run without bank conflicts, and every
// reader below goes through tile_offset(), the single definition of the layout.
#pragma once

#include <cstdint>

#include "common/intrinsics.cuh"
#include "common/sm80/cp_async.cuh"
#include "common/sm80/mma.cuh"

namespace msa {

constexpr int kTileRowBytes = 256;

__device__ __forceinline__ uint32_t tile_offset(int row, int chunk) {
    return static_cast<uint32_t>(row * kTileRowBytes + ((chunk ^ (row & 7)) << 4));
}

// Byte offset of the bf16 element (row, col).
__device__ __forceinline__ uint32_t tile_elem_offset(int row, int col) {
    return tile_offset(row, col >> 3) + static_cast<uint32_t>((col & 7) << 1);
}

// Issues the cp.async copies of a ROWS x 128 bf16 tile; the caller commits and waits.
// row_src(r) returns the global address of row r, or nullptr to zero-fill it; `any` is a valid
// global address used as the (unread) source of zero-filled chunks. Thread `tid` copies chunk
// tid % 16 of rows tid / 16 + (THREADS / 16) i: 16 consecutive threads fill one row, so a
// quarter-warp writes 128 contiguous (swizzled) bytes and reads 128 contiguous global bytes.
template <int ROWS, int THREADS, class RowSrc>
__device__ __forceinline__ void tile_load_async(uint32_t tile, RowSrc&& row_src, const uint16_t* any, int tid) {
    static_assert(THREADS % 16 == 0 && (ROWS * 16) % THREADS == 0, "whole rows per pass");
    const int chunk = tid & 15;
#pragma unroll
    for (int i = 0; i < ROWS * 16 / THREADS; ++i) {
        const int row = (tid >> 4) + i * (THREADS / 16);
        const uint16_t* src = row_src(row);
        cp_async_16(tile + tile_offset(row, chunk), src ? src + chunk * 8 : any, src != nullptr);
    }
}

// ---- mma operand fragments from a tile (see sm80/mma.cuh for the fragment layouts) ----
// Each helper issues one ldmatrix.x4; m0, n0, k0 are multiples of 8 (16 for k0 of A).

// A (16x16) at rows m0.., k-columns k0.. of a tile that stores A[m][k] (k contiguous).
__device__ __forceinline__ void ldsm_a(uint32_t tile, int m0, int k0, uint32_t (&a)[4]) {
    const int lane = threadIdx.x & 31, mat = lane >> 3, r = lane & 7;
    ldsm_x4(tile + tile_offset(m0 + r + (mat & 1) * 8, (k0 >> 3) + (mat >> 1)), a);
}

// A (16x16) at m0.., k0.. of a tile that stores A transposed, tile[k][m] (m contiguous).
__device__ __forceinline__ void ldsm_a_trans(uint32_t tile, int m0, int k0, uint32_t (&a)[4]) {
    const int lane = threadIdx.x & 31, mat = lane >> 3, r = lane & 7;
    ldsm_x4_trans(tile + tile_offset(k0 + r + (mat >> 1) * 8, (m0 >> 3) + (mat & 1)), a);
}

// B of two n-tiles (n0.., n0+8..) for k-step k0 from a tile that stores tile[n][k]
// (k contiguous, e.g. K rows for S = Q K^T). b[0], b[1]: n-tile n0; b[2], b[3]: n-tile n0 + 8.
__device__ __forceinline__ void ldsm_b_nk(uint32_t tile, int n0, int k0, uint32_t (&b)[4]) {
    const int lane = threadIdx.x & 31, mat = lane >> 3, r = lane & 7;
    ldsm_x4(tile + tile_offset(n0 + r + (mat >> 1) * 8, (k0 >> 3) + (mat & 1)), b);
}

// Same output as ldsm_b_nk from a tile that stores tile[k][n] (n contiguous, e.g. V rows for
// O = P V): the transposing load turns two consecutive k rows into one register.
__device__ __forceinline__ void ldsm_b_kn(uint32_t tile, int k0, int n0, uint32_t (&b)[4]) {
    const int lane = threadIdx.x & 31, mat = lane >> 3, r = lane & 7;
    ldsm_x4_trans(tile + tile_offset(k0 + r + (mat & 1) * 8, (n0 >> 3) + (mat >> 1)), b);
}

// Stores a pair of bf16 (columns col, col + 1; col even) packed by pack_bf16.
__device__ __forceinline__ void tile_store_pair(uint8_t* tile, int row, int col, uint32_t pair) {
    *reinterpret_cast<uint32_t*>(tile + tile_elem_offset(row, col)) = pair;
}

}  // namespace msa
