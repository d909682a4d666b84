/* vh_random.h - the one hash behind every random draw in vithost.
 *
 * splitmix64 (Steele, Lea, Flood 2014). Counter-based use keeps results
 * independent of thread count and call order: the u-th draw of a stream with
 * key k is vh_splitmix64_mix(k + (u + 1) * VH_SPLITMIX64_GAMMA). Inline, so it
 * adds nothing to the ABI.
 */
#ifndef VITHOST_VH_RANDOM_H
#define VITHOST_VH_RANDOM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define VH_SPLITMIX64_GAMMA UINT64_C(0x9E3779B97F4A7C15)

/* splitmix64's finaliser: a bijection that spreads every input bit. */
static inline uint64_t vh_splitmix64_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* One splitmix64 step from state x: a well-mixed hash of x. */
static inline uint64_t vh_splitmix64(uint64_t x) {
    return vh_splitmix64_mix(x + VH_SPLITMIX64_GAMMA);
}

#ifdef __cplusplus
}
#endif
#endif
