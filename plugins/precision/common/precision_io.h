/* precision_io.h - what every precision plugin of this tree (amp, fp16,
 * fp32) hands out the same way: its policy, copied into a caller's struct of
 * any minor, and the 16-byte header its state blob starts with (a tag, so a
 * checkpoint of another precision plugin is refused by name, a version, and
 * one word of the policy that wrote it). Compiled into each plugin. */
#ifndef VITHOST_PLUGINS_PRECISION_IO_H
#define VITHOST_PLUGINS_PRECISION_IO_H

#include <stddef.h>
#include <stdint.h>

#include "vithost/vh_host.h"
#include "vithost/vh_precision.h"

typedef struct precision_state_header {
    uint32_t magic, version;
    uint32_t word;     /* the writer's policy (amp: its dtype; fp16: master_weights) */
    uint32_t reserved; /* zero */
} precision_state_header;

/* Fills what out->struct_size covers from `full` (this minor's policy) and
 * leaves out->struct_size as the caller set it. */
vh_status precision_policy_out(vh_host *host, vh_precision_policy *out,
                               const vh_precision_policy *full);

/* Writes h at the front of buf, which must hold `need` bytes (the caller
 * writes the rest). */
vh_status precision_state_save_header(vh_host *host, void *buf, size_t bytes, size_t need,
                                      const precision_state_header *h);

/* Checks the blob of plugin `name` before anything is read from it: the tag
 * `magic`, exactly `need` bytes, version `version`; then reads its header
 * into *h. */
vh_status precision_state_load_header(vh_host *host, const char *name, uint32_t magic,
                                      uint32_t version, const void *buf, size_t bytes,
                                      size_t need, precision_state_header *h);

#endif
