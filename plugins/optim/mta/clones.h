/* clones.h - element loops built for AVX-512 and AVX2 as well as the
 * baseline, one picked at load time (GCC's target_clones; elsewhere the
 * baseline alone). Each clone gives the same bits: the loops are
 * element-wise, without contraction (-ffp-contract=off). Use it on static
 * functions, or on ones the plugin does not export (the ifunc resolver stays
 * out of the plugin's symbols). */
#ifndef VH_MTA_CLONES_H
#define VH_MTA_CLONES_H

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MTA_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MTA_CLONES
#endif

#endif
