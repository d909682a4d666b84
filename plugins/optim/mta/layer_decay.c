/* layer_decay.c - per-parameter learning-rate scales of layer-wise decay,
 * from the parameter names as timm's vit group matcher reads them (see
 * layer_decay.h). */
#include "layer_decay.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* timm's sort key: (group, index); the final norm's index is timm's
 * MATCH_PREV_GROUP, which sorts after every block and joins the previous
 * layer. */
enum { GROUP_STEM = 0, GROUP_BLOCKS = 1, GROUP_TOP = 2 };
#define MATCH_PREV 99999LL

typedef struct ld_key {
    int group;
    long long index;
} ld_key;

static int starts_with(const char *s, const char *prefix) {
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* 0, or -1 for a "blocks." name without a decimal index. */
static int key_of(const char *name, ld_key *k) {
    static const char *const stem[] = {"cls_token", "reg_token", "pos_embed", "patch_embed",
                                       "norm_pre"};
    k->index = 0;
    for (size_t i = 0; i < sizeof stem / sizeof stem[0]; i++)
        if (starts_with(name, stem[i])) return k->group = GROUP_STEM, 0;
    if (starts_with(name, "blocks.")) {
        const char *d = name + 7;
        if (*d < '0' || *d > '9') return -1;
        k->group = GROUP_BLOCKS;
        while (*d >= '0' && *d <= '9' && k->index < MATCH_PREV)
            k->index = k->index * 10 + (*d++ - '0');
        return k->index < MATCH_PREV ? 0 : -1;
    }
    if (starts_with(name, "norm")) return k->group = GROUP_BLOCKS, k->index = MATCH_PREV, 0;
    k->group = GROUP_TOP;
    return 0;
}

static int key_cmp(const void *pa, const void *pb) {
    const ld_key *a = pa, *b = pb;
    if (a->group != b->group) return a->group < b->group ? -1 : 1;
    return a->index < b->index ? -1 : a->index > b->index;
}

int64_t mta_table_params(const vh_param_table *table) {
    int64_t n = 0;
    for (int32_t u = 0; table && u < table->num_units; u++) n += table->units[u].num_params;
    return n;
}

/* The layer id of key k among the sorted distinct keys (timm's remapping). */
static int layer_of(const ld_key *sorted, int64_t n, const ld_key *k) {
    int lid = -1;
    for (int64_t i = 0; i < n; i++) {
        if (i > 0 && key_cmp(&sorted[i], &sorted[i - 1]) == 0) continue;
        if (lid < 0 || sorted[i].index != MATCH_PREV) lid++;
        if (key_cmp(&sorted[i], k) == 0) return lid;
    }
    return lid;
}

int mta_layer_scales(const vh_param_table *table, double decay, double *scales, char *why,
                     size_t why_len) {
    if (!(decay > 0.0 && decay <= 1.0))
        return snprintf(why, why_len, "layer_decay %g is outside (0, 1]", decay), -1;
    const int64_t n = mta_table_params(table);
    ld_key *keys = calloc((size_t)(n ? n : 1), sizeof *keys);
    ld_key *sorted = calloc((size_t)(n ? n : 1), sizeof *sorted);
    if (!keys || !sorted) {
        free(keys), free(sorted);
        return snprintf(why, why_len, "out of memory for %lld layer ids", (long long)n), -1;
    }
    int64_t i = 0, blocks = 0;
    int bad = 0;
    for (int32_t u = 0; u < table->num_units && !bad; u++)
        for (int32_t p = 0; p < table->units[u].num_params && !bad; p++, i++) {
            const char *name = table->units[u].params[p].name;
            if (!name || key_of(name, &keys[i]) != 0) {
                snprintf(why, why_len,
                         "parameter '%s' starts with 'blocks.' but has no block number "
                         "(layer_decay needs timm's ViT names: blocks.<i>.*)",
                         name ? name : "(unnamed)");
                bad = 1;
            }
            blocks += keys[i].group == GROUP_BLOCKS && keys[i].index != MATCH_PREV;
        }
    if (!bad && blocks == 0) {
        snprintf(why, why_len,
                 "no parameter is named blocks.<i>.*, so the model's layers are unknown "
                 "(layer_decay follows timm's ViT names: cls_token/pos_embed/patch_embed, "
                 "blocks.<i>, norm, head); set layer_decay: 1");
        bad = 1;
    }
    if (!bad) {
        memcpy(sorted, keys, (size_t)n * sizeof *keys);
        qsort(sorted, (size_t)n, sizeof *sorted, key_cmp);
        const int top = layer_of(sorted, n, &sorted[n - 1]);
        for (i = 0; i < n; i++)
            scales[i] = pow(decay, (double)(top - layer_of(sorted, n, &keys[i])));
    }
    free(keys);
    free(sorted);
    return bad ? -1 : 0;
}
