/* freeze.h - which parameters the `freeze` key keeps fixed, by name.
 *
 * `freeze` is a comma-separated list of patterns. A pattern names a unit of
 * the parameter table ("embed", "blocks.3", "head": every parameter of it),
 * a parameter by its timm name ("cls_token", "blocks.0.attn.qkv.weight") or
 * a dotted prefix of such names ("patch_embed", "blocks.0.attn"); a pattern
 * with *, ? or [ is a glob (fnmatch) over unit and parameter names
 * ("blocks.[0-5]", "blocks.*.norm1.*"). A frozen parameter is never updated:
 * no step, no weight decay, its optimizer state untouched, and its gradient
 * left out of the clipping norm (as a torch parameter with requires_grad
 * off, which has no gradient). Its gradient is still computed. */
#ifndef VH_MTA_FREEZE_H
#define VH_MTA_FREEZE_H

#include <stddef.h>
#include <stdint.h>

#include "vithost/vh_params.h"

/* Sets frozen[i] (one per parameter, in table order) to 1 for each parameter
 * a pattern of `list` matches, 0 for the others. Returns how many are
 * frozen; -1 with one line in why[] when a pattern matches nothing (the line
 * names it and lists the units) or is empty. */
int64_t mta_freeze_mask(const vh_param_table *table, const char *list, unsigned char *frozen,
                        char *why, size_t why_len);

#endif
