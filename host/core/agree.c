/* agree.c - the ranks compare what they run before the first step (see
 * agree.h). */
#define _POSIX_C_SOURCE 200809L
#include "agree.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef VITHOST_VERSION
#define VITHOST_VERSION "0.0.0"
#endif

/* Past this a length from another rank is not a list of keys but garbage. */
#define AGREE_MAX_BYTES ((size_t)1 << 20)

/* What the first exchange sends: the digest of a rank's list, its length. */
typedef struct agree_head {
    uint64_t digest;
    int64_t len;
} agree_head;

/* ---- what a rank runs: a list of entries --------------------------------------
 * Four NUL-terminated fields each: the key, its value as compared, its value
 * as written and where it came from; the last two are for the message only.
 * Keys starting with '#' are never compared (the recipe's file name). */

typedef struct agree_list {
    char *text;
    size_t len, cap;
    int nomem;
} agree_list;

typedef struct agree_entry {
    const char *key, *value, *shown, *where;
} agree_entry;

static void put_field(agree_list *l, const char *s) {
    size_t n = strlen(s) + 1;
    if (l->nomem) return;
    if (l->len + n > l->cap) {
        size_t cap = l->cap ? l->cap : 4096;
        while (cap < l->len + n) cap *= 2;
        char *t = realloc(l->text, cap);
        if (!t) {
            l->nomem = 1;
            return;
        }
        l->text = t;
        l->cap = cap;
    }
    memcpy(l->text + l->len, s, n);
    l->len += n;
}

static void put(agree_list *l, const char *key, const char *value, const char *shown,
                const char *where) {
    put_field(l, key);
    put_field(l, value);
    put_field(l, shown);
    put_field(l, where);
}

static void origin_text(const vh_config_origin *o, char *buf, size_t len) {
    if (o->source == VH_CONFIG_SOURCE_RECIPE)
        snprintf(buf, len, "%s:%d", o->file ? o->file : "?", (int)o->line);
    else snprintf(buf, len, "%s", o->source == VH_CONFIG_SOURCE_SET ? "--set" : "default");
}

static void put_section(agree_list *l, const char *section, const vh_section_config *c) {
    for (int i = 0; i < c->count; i++) {
        const vh_config_entry *e = &c->entries[i];
        /* the one rank-local key: see agree.h */
        if (strcmp(section, "run") == 0 && strcmp(e->key->key, "comm") == 0) continue;
        char key[256], number[64], where[1024];
        snprintf(key, sizeof key, "%s.%s", section, e->key->key);
        const char *shown = e->has_value ? e->text : "(not set)";
        const char *value = shown;
        /* numbers by value: `1e-3` on one rank and `0.001` on another agree */
        if (e->has_value && e->key->type == VH_CONFIG_TYPE_INT)
            snprintf(number, sizeof number, "%lld", (long long)e->as.i), value = number;
        else if (e->has_value && e->key->type == VH_CONFIG_TYPE_FLOAT)
            snprintf(number, sizeof number, "%.17g", e->as.f), value = number;
        else if (e->has_value && e->key->type == VH_CONFIG_TYPE_BOOL)
            value = e->as.b ? "true" : "false";
        origin_text(&e->origin, where, sizeof where);
        put(l, key, value, shown, where);
    }
}

static void put_plugin(agree_list *l, const vh_run *run, int role) {
    const vh_plugin_descriptor *desc = run->plugins[role].desc;
    const char *section = recipe_role_section((vh_role)role);
    char key[64], value[512], where[1024] = "";
    snprintf(key, sizeof key, "%s.plugin", section);
    snprintf(value, sizeof value, "%s %s (ABI %u.%u)", desc->name, desc->version,
             (unsigned)desc->abi_major, (unsigned)desc->abi_minor);
    const vh_recipe_value *v =
        recipe_find_value(recipe_find_section(&run->recipe, section), "plugin");
    if (v) origin_text(&v->origin, where, sizeof where);
    put(l, key, value, value, where);
}

static void describe(const vh_run *run, agree_list *l) {
    char version[128];
    snprintf(version, sizeof version, "%s (plugin ABI %d.%d)", VITHOST_VERSION, VH_ABI_MAJOR,
             VH_ABI_MINOR);
    put(l, "vithost", version, version, "");
    put(l, "#recipe", "", run->recipe.file ? run->recipe.file : "?", "");
    put_section(l, "run", &run->run_config);
    /* each role's plugin before its keys: a different plugin is named as
     * such, not by the first key only one of them takes */
    for (int r = 0; r < VH_HOST_ROLE_COUNT; r++) {
        put_plugin(l, run, r);
        put_section(l, recipe_role_section((vh_role)r), &run->configs[r]);
    }
}

/* The entry at *at of text[0, len), checked (the text may come from another
 * rank); 0 at the end. */
static int next_entry(const char *text, size_t len, size_t *at, agree_entry *e) {
    const char **fields[4] = {&e->key, &e->value, &e->shown, &e->where};
    for (int i = 0; i < 4; i++) {
        if (*at >= len) return 0;
        const char *nul = memchr(text + *at, '\0', len - *at);
        if (!nul) return 0;
        *fields[i] = text + *at;
        *at = (size_t)(nul - text) + 1;
    }
    return 1;
}

static int find_entry(const char *text, size_t len, const char *key, agree_entry *e) {
    size_t at = 0;
    while (next_entry(text, len, &at, e))
        if (strcmp(e->key, key) == 0) return 1;
    return 0;
}

/* FNV-1a over the compared fields. */
static uint64_t digest(const agree_list *l) {
    uint64_t h = 1469598103934665603ULL;
    size_t at = 0;
    agree_entry e;
    while (next_entry(l->text, l->len, &at, &e)) {
        if (e.key[0] == '#') continue;
        const char *parts[2] = {e.key, e.value};
        for (int i = 0; i < 2; i++)
            for (const unsigned char *c = (const unsigned char *)parts[i];; c++) {
                h = (h ^ *c) * 1099511628211ULL;
                if (!*c) break;
            }
    }
    return h;
}

/* ---- the exchange -------------------------------------------------------------
 * Only all-gathers of bytes: every backend moves bytes, whatever dtypes and
 * reductions it has. */

/* Each rank's `count` bytes of send into recv (world x count), staged
 * through device memory when the device is not the CPU (NCCL reads device
 * memory only). */
static vh_status gather_bytes(vh_run *run, const void *send, void *recv, size_t count) {
    vh_comm *c = &run->comm;
    const vh_device_ops *dev = run->device;
    if (dev->kind == VH_DEVICE_KIND_CPU)
        return vh_comm_all_gather(c, send, recv, count, VH_DTYPE_U8);
    size_t out = count * (size_t)c->world_size;
    void *d_in = NULL, *d_out = NULL;
    vh_status st = dev->alloc(dev->device, count, &d_in);
    if (st == VH_STATUS_OK) st = dev->alloc(dev->device, out, &d_out);
    if (st == VH_STATUS_OK)
        st = dev->copy(dev->device, d_in, send, count, VH_COPY_KIND_HOST_TO_DEVICE, NULL);
    if (st == VH_STATUS_OK) st = vh_comm_all_gather(c, d_in, d_out, count, VH_DTYPE_U8);
    if (st == VH_STATUS_OK)
        st = dev->copy(dev->device, recv, d_out, out, VH_COPY_KIND_DEVICE_TO_HOST, NULL);
    if (d_in) dev->free(dev->device, d_in);
    if (d_out) dev->free(dev->device, d_out);
    return st;
}

/* The first key whose value differs between a (rank 0's) and b: in a's
 * order, then the keys only b has. A key one side lacks gets key NULL. */
static int first_difference(const char *a, size_t alen, const char *b, size_t blen,
                            agree_entry *ea, agree_entry *eb) {
    static const agree_entry absent = {NULL, "", "", ""};
    size_t at = 0;
    while (next_entry(a, alen, &at, ea)) {
        if (ea->key[0] == '#') continue;
        if (!find_entry(b, blen, ea->key, eb)) *eb = absent;
        if (!eb->key || strcmp(ea->value, eb->value) != 0) return 1;
    }
    at = 0;
    while (next_entry(b, blen, &at, eb)) {
        if (eb->key[0] == '#' || find_entry(a, alen, eb->key, ea)) continue;
        *ea = absent;
        return 1;
    }
    return 0;
}

/* "'0.001' (a.yaml:5)", or what a rank without the key has. */
static void value_text(const agree_entry *e, char *buf, size_t len) {
    if (!e->key) snprintf(buf, len, "not a key of its section");
    else if (e->where[0]) snprintf(buf, len, "'%s' (%s)", e->shown, e->where);
    else snprintf(buf, len, "'%s'", e->shown);
}

/* The message, from rank 0's and rank `other`'s lists. */
static vh_status explain(const char *t0, size_t len0, const char *t1, size_t len1,
                         int32_t other, int32_t differing, vh_diag *d) {
    agree_entry e0, e1, file0, file1;
    const char *name0 = find_entry(t0, len0, "#recipe", &file0) ? file0.shown : "?";
    const char *name1 = find_entry(t1, len1, "#recipe", &file1) ? file1.shown : "?";
    char more[64] = "";
    if (differing > 1)
        snprintf(more, sizeof more, " (and %d more %s from rank 0)", (int)differing - 1,
                 differing == 2 ? "rank differs" : "ranks differ");
    if (!first_difference(t0, len0, t1, len1, &e0, &e1))
        return diag_set(d, VH_STATUS_ERR_CONFIG,
                        "the ranks do not run the same thing: rank 0 and rank %d resolved "
                        "their recipes (%s, %s) differently%s",
                        (int)other, name0, name1, more);
    char v0[1200], v1[1200], files[1200] = "";
    value_text(&e0, v0, sizeof v0);
    value_text(&e1, v1, sizeof v1);
    if (strcmp(name0, name1) != 0)
        snprintf(files, sizeof files, " (rank 0 read %s, rank %d read %s)", name0, (int)other,
                 name1);
    return diag_set(d, VH_STATUS_ERR_CONFIG,
                    "the ranks do not run the same thing: %s is %s on rank 0 but %s on rank "
                    "%d%s; every rank must run the same recipe, --set options, plugins and "
                    "vithost%s",
                    e0.key ? e0.key : e1.key, v0, v1, (int)other, more, files);
}

/* A mismatch: every rank's list, padded to the longer of rank 0's and
 * rank `other`'s, onto every rank (one gather), and the same message on each. */
static vh_status disagree(vh_run *run, const agree_list *mine, const agree_head *all,
                          int32_t other, int32_t differing, vh_diag *d) {
    size_t len0 = (size_t)all[0].len, len1 = (size_t)all[other].len;
    size_t pad = len0 > len1 ? len0 : len1;
    if (all[0].len < 0 || all[other].len < 0 || pad > AGREE_MAX_BYTES)
        return diag_set(d, VH_STATUS_ERR_COMM,
                        "the ranks do not run the same thing, and rank 0 or rank %d sent a "
                        "malformed description (%lld and %lld bytes): are they the same "
                        "vithost?",
                        (int)other, (long long)all[0].len, (long long)all[other].len);
    char *send = calloc(pad + 1, 1), *lists = calloc((size_t)run->comm.world_size, pad + 1);
    vh_status st = send && lists ? VH_STATUS_OK : VH_STATUS_ERR_NOMEM;
    if (st == VH_STATUS_OK) {
        memcpy(send, mine->text, mine->len < pad ? mine->len : pad);
        st = gather_bytes(run, send, lists, pad + 1);
    }
    if (st == VH_STATUS_OK)
        st = explain(lists, len0, lists + (size_t)other * (pad + 1), len1, other, differing, d);
    else diag_set(d, st, "the ranks do not run the same thing, and sending rank 0's and "
                         "rank %d's recipes to every rank failed (%s)",
                  (int)other, vh_status_str(st));
    free(send);
    free(lists);
    /* every rank has the message and ends with it: no abort, rank 0 says it */
    if (st == VH_STATUS_ERR_CONFIG) run->failed_together = 1;
    return st;
}

vh_status agree_check(vh_run *run, vh_diag *d) {
    vh_comm *c = &run->comm;
    if (c->world_size <= 1) return VH_STATUS_OK;
    agree_list mine = {0};
    describe(run, &mine);
    /* (digest, length) of every rank; this shape must stay the same in
     * every version, so that two versions can at least say they differ */
    agree_head me = {digest(&mine), (int64_t)mine.len};
    agree_head *all = calloc((size_t)c->world_size, sizeof *all);
    vh_status st = mine.nomem || !all ? VH_STATUS_ERR_NOMEM : VH_STATUS_OK;
    if (st == VH_STATUS_OK) st = gather_bytes(run, &me, all, sizeof me);
    if (st != VH_STATUS_OK) {
        diag_set(d, st, "checking that the %d ranks run the same recipe failed: a collective "
                        "over %s failed (%s)",
                 (int)c->world_size, c->backend ? c->backend : "?", vh_status_str(st));
    } else {
        int32_t other = -1, differing = 0;
        /* (digests only: lengths differ with how equal values are written) */
        for (int32_t r = 1; r < c->world_size; r++)
            if (all[r].digest != all[0].digest) {
                if (other < 0) other = r;
                differing++;
            }
        if (other > 0) st = disagree(run, &mine, all, other, differing, d);
    }
    free(all);
    free(mine.text);
    return st;
}
