// AMX tiles (Intel's Advanced Matrix Extensions), for the kernels built with -mamx-tile -mamx-bf16: the tile
// configuration every product here uses, and the permission Linux asks for before a process may touch the tiles.
#pragma once

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && defined(__linux__)
#define GUMIHO_AMX_TILES 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

namespace amx {

struct alignas(64) TileConfig {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t bytes_per_row[16] = {};
    uint8_t rows[16] = {};
};

// Linux lets a process use the tiles' 8 KB of state once it asks (arch_prctl ARCH_REQ_XCOMP_PERM, XTILEDATA).
inline bool usable() {
    static const bool granted = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
    return granted;
}

// Tiles 0-7 as 16 rows of 64 bytes, for the calling thread (each thread has its own tile registers).
inline void configure() {
    TileConfig config;
    for (int i = 0; i < 8; ++i) {
        config.bytes_per_row[i] = 64;
        config.rows[i] = 16;
    }
    _tile_loadconfig(&config);
}

}  // namespace amx
#endif
