/* fuzz_recipe.c - recipes: YAML text, --set assignments, schema checks.
 *
 * Input: the recipe's bytes, then optionally NUL-separated `--set`
 * assignments (a recipe may not hold NUL bytes, so the split is free):
 *
 *     run: {epochs: 2}\n  \0 run.seed=3 \0 optim.lr=0.5
 *
 * The recipe is read as `vithost check` reads it (recipe_load_string), the
 * assignments applied in order, the `run` section resolved against the
 * host's schema and each role section against the schema of a real plugin
 * of that role (vit, fp32, ddp, test_optim, idx; loaded once; mta's
 * CMakeLists passes gcc-only flags, so the clang build leaves it out). Every refusal must
 * carry a message; a value pointed at must echo its line.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "fuzz_util.h"
#include "recipe.h"
#include "vtables.h"

static vh_run schemas_run; /* keeps the real plugins' schemas loaded */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    setenv("VITHOST_PLUGIN_PATH", VH_FUZZ_PLUGIN_DIR, 1);
    const char *text = "model: {plugin: vit}\n"
                       "precision: {plugin: fp32}\n"
                       "sharding: {plugin: ddp}\n"
                       "optim: {plugin: test_optim}\n"
                       "data: {plugin: idx}\n";
    vh_diag d = {{0}};
    vh_run_options opts = {.out = stderr};
    if (run_open_text(&schemas_run, "schemas.yaml", text, &opts, &d) != VH_STATUS_OK) {
        fprintf(stderr, "fuzz_recipe: cannot load the plugins for their schemas: %s\n", d.text);
        abort();
    }
    return 0;
}

static void require_message(vh_status st, const vh_diag *d, const char *what) {
    if (st != VH_STATUS_OK) fuzz_require(d->text[0] != '\0', what, "failed without a message");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *text = (const char *)data;
    const uint8_t *nul = memchr(data, 0, size);
    size_t recipe_len = nul ? (size_t)(nul - data) : size;

    vh_recipe r;
    vh_diag d = {{0}};
    vh_status st = recipe_load_string(&r, "fuzz.yaml", text, recipe_len, &d);
    require_message(st, &d, "recipe_load_string");
    if (st != VH_STATUS_OK) return 0;

    /* The --set assignments: NUL-terminated copies of each piece. */
    size_t at = recipe_len;
    while (st == VH_STATUS_OK && at < size) {
        at++; /* the NUL */
        const uint8_t *end = memchr(data + at, 0, size - at);
        size_t len = end ? (size_t)(end - (data + at)) : size - at;
        char *set = malloc(len + 1);
        if (!set) abort();
        memcpy(set, data + at, len);
        set[len] = '\0';
        d.text[0] = '\0';
        st = recipe_apply_set(&r, set, &d);
        require_message(st, &d, "recipe_apply_set");
        free(set);
        at += len;
    }

    if (st == VH_STATUS_OK) {
        vh_section_config c;
        d.text[0] = '\0';
        st = config_resolve(&c, &r, "run", vh_run_schema, NULL, &d);
        require_message(st, &d, "config_resolve(run)");
        if (st == VH_STATUS_OK) config_free(&c);
        for (int role = 0; role < VH_HOST_ROLE_COUNT; role++) {
            const char *name = recipe_role_section((vh_role)role);
            if (!recipe_find_section(&r, name)) continue;
            d.text[0] = '\0';
            vh_status rs = config_resolve(&c, &r, name,
                                          schemas_run.plugins[role].desc->schema, "plugin", &d);
            require_message(rs, &d, "config_resolve(role)");
            if (rs == VH_STATUS_OK) config_free(&c);
        }
    }

    /* Point at every value as a later check would: file:line:col, echo, caret. */
    for (int s = 0; s < r.count; s++) {
        const vh_recipe_section *sec = &r.sections[s];
        for (int v = 0; v < sec->count; v++) {
            d.text[0] = '\0';
            recipe_diag_value(&r, sec, &sec->values[v], v & 1, &d, VH_STATUS_ERR_CONFIG,
                              "fuzz: %s", sec->values[v].text);
            fuzz_require(d.text[0] != '\0', "recipe_diag_value", "no message");
        }
        d.text[0] = '\0';
        recipe_diag_value(&r, sec, NULL, 1, &d, VH_STATUS_ERR_CONFIG, "fuzz");
    }
    recipe_free(&r);
    return 0;
}
