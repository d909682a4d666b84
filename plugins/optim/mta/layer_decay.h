/* layer_decay.h - layer-wise learning-rate decay (BEiT, timm's
 * param_groups_layer_decay) from the parameter table's names.
 *
 * Layer ids follow timm's VisionTransformer.group_matcher, by name (timm
 * matches names too, so no ABI member is needed):
 *   - the stem, layer 0: names starting with cls_token, reg_token, pos_embed,
 *     patch_embed or norm_pre;
 *   - blocks.<i>...: the (i + 1)-th distinct block index, in numeric order;
 *   - norm...: the final norm of a class-token ViT joins the LAST block's
 *     layer (timm's MATCH_PREV_GROUP);
 *   - anything else (fc_norm, head, ...): one top layer after the blocks.
 * With L layers in all, a parameter of layer id gets the scale
 * layer_decay^(L - 1 - id): 1 for the head, layer_decay^(depth + 1) for the
 * stem. A table with no blocks.<i> parameter, or a "blocks." name without a
 * decimal index, does not follow the convention and is refused. */
#ifndef VH_MTA_LAYER_DECAY_H
#define VH_MTA_LAYER_DECAY_H

#include <stddef.h>

#include "vithost/vh_params.h"

/* One scale per parameter of `table`, in table order (unit by unit) into
 * scales[]. 0 on success; -1 with one line in why[] when the names do not
 * follow the convention above or decay is outside (0, 1]. */
int mta_layer_scales(const vh_param_table *table, double decay, double *scales, char *why,
                     size_t why_len);

/* Parameters of the table (the length of scales[]). */
int64_t mta_table_params(const vh_param_table *table);

#endif
