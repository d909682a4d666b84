/* runtime.c - opening a run: recipe, --set, schemas, plugins; printing the
 * resolved recipe. The device and the communicator: backends.c. */
#define _POSIX_C_SOURCE 200809L
#include "runtime.h"
#include "vtables.h"

#include <stdlib.h>
#include <string.h>

#include "vithost/vh_runtime.h"

const vh_config_key vh_run_schema[] = {
    {"device", VH_CONFIG_TYPE_ENUM, "cpu", "where to compute", "cpu|cuda", 0, 0, 0},
    {"comm", VH_CONFIG_TYPE_ENUM, "auto",
     "communicator between ranks: auto (mpi when started by mpirun or srun with more than "
     "one process, else self), self (one process), mpi (libvh_comm_mpi.so), nccl "
     "(libvh_comm_nccl.so)",
     "auto|self|mpi|nccl", 0, 0, 0},
    {"seed", VH_CONFIG_TYPE_INT, "0", "seed of every random draw (init, shuffles, dropout)",
     NULL, 0, 2147483647.0, 0},
    {"epochs", VH_CONFIG_TYPE_INT, "1", "passes over the training split", NULL, 1, 1e6, 0},
    {"steps", VH_CONFIG_TYPE_INT, "0", "stop after this many steps (0: epochs decide)", NULL,
     0, 1e12, 0},
    {"batch_size", VH_CONFIG_TYPE_INT, "128",
     "images per micro-batch on each rank (a step's with run.grad_accum 1)", NULL, 1, 1e6, 0},
    {"grad_accum", VH_CONFIG_TYPE_INT, "1",
     "micro-batches of run.batch_size per optimizer step (gradient accumulation): the global "
     "batch is batch_size x grad_accum x ranks, ranks communicate once per step; a pass's "
     "trailing micro-batches that fill no whole step are dropped",
     NULL, 1, 65536, 0},
    {"eval_every", VH_CONFIG_TYPE_INT, "1", "evaluate every N epochs (0: not by epochs)", NULL,
     0, 1e6, 0},
    {"eval_every_steps", VH_CONFIG_TYPE_INT, "0", "also evaluate every N steps (0: never)", NULL,
     0, 1e12, 0},
    {"log_every", VH_CONFIG_TYPE_INT, "10", "steps between progress lines", NULL, 1, 1e9, 0},
    {"checkpoint_every", VH_CONFIG_TYPE_INT, "0",
     "write a checkpoint every N steps (0: only at the end and when stopped)", NULL, 0, 1e12, 0},
    {"keep_checkpoints", VH_CONFIG_TYPE_INT, "3", "newest checkpoints kept (0: all)", NULL, 0,
     1e6, 0},
    {"peak_tflops", VH_CONFIG_TYPE_FLOAT, "0",
     "device peak for MFU, TFLOP/s (0: a GEMM probe in the policy's compute dtype)", NULL, 0, 1e6, 0},
    /* Dead runs stop: a healthy dynamic loss scale finds one that fits in
     * about log2(init_scale / needed) skips in a row (16 from 65536, 24 from
     * the 2^24 ceiling); 50 is twice that with room. A total cannot have one
     * default: a long healthy run skips about once per growth interval. */
    {"max_consecutive_skips", VH_CONFIG_TYPE_INT, "50",
     "stop the run (exit 1) once more than this many steps in a row were skipped for Inf/NaN "
     "gradients, naming the cause and the last good checkpoint (0: no limit)",
     NULL, 0, 1e12, 0},
    {"max_skipped_steps", VH_CONFIG_TYPE_INT, "0",
     "stop the run (exit 1) once more than this many steps in all were skipped, those before "
     "a resume included (0: no limit on the total)",
     NULL, 0, 1e12, 0},
    {"write_errors", VH_CONFIG_TYPE_ENUM, "stop",
     "a line of metrics.jsonl or of the progress that cannot be written (a full disk): stop "
     "(exit 1) or warn once and go on without it (a line is written whole or not at all)",
     "stop|warn", 0, 0, 0},
    {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
};

int64_t run_config_int(const vh_run *run, const char *key) {
    const vh_config_entry *e = config_find(&run->run_config, key);
    return e ? e->as.i : 0;
}

const char *run_config_string(const vh_run *run, const char *key) {
    const vh_config_entry *e = config_find(&run->run_config, key);
    return e ? e->text : "";
}

/* Loads the plugin a role section names and resolves the section against
 * the plugin's schema. */
static vh_status open_role(vh_run *run, vh_role role, vh_diag *d) {
    const char *section_name = recipe_role_section(role);
    const vh_recipe_section *s = recipe_find_section(&run->recipe, section_name);
    if (!s)
        return diag_set(d, VH_STATUS_ERR_CONFIG,
                        "%s: the recipe has no '%s' section; every recipe names one plugin "
                        "per role (model, precision, sharding, optim, data), e.g.\n"
                        "    %s: { plugin: NAME }\n(`vithost plugins` lists what is installed)",
                        run->recipe.file, section_name, section_name);
    const vh_recipe_value *v = recipe_find_value(s, "plugin");
    if (!v) /* at the section in the file, or at the file (a whole-section --set) */
        return recipe_diag_value(&run->recipe, s, NULL, 0, d, VH_STATUS_ERR_CONFIG,
                                 "section '%s' names no plugin; add `plugin: NAME` "
                                 "(`vithost plugins` lists what is installed)",
                                 section_name);
    vh_diag why;
    vh_status st = loader_resolve(&run->plugins[role], &run->path, v->text, role, &why);
    if (st != VH_STATUS_OK) {
        run->load_failed = 1;
        return recipe_diag_value(&run->recipe, s, v, 0, d, st, "%s.plugin: %s", section_name,
                                 why.text);
    }
    const vh_plugin_descriptor *desc = run->plugins[role].desc;
    st = config_resolve_merged(&run->configs[role], &run->recipe, section_name, desc->schema,
                               config_shared_keys(desc), "plugin", d);
    if (st != VH_STATUS_OK) return st;
    host_impl_init(&run->hosts[role], run, role, &run->configs[role]);
    return VH_STATUS_OK;
}

static void run_init(vh_run *run, const vh_run_options *opts) {
    memset(run, 0, sizeof *run);
    run->opts = *opts;
    if (!run->opts.out) run->opts.out = stdout;
    vh_comm_self_init(&run->comm);
    run->device = vh_cpu_device_ops();
}

static vh_status run_open_loaded(vh_run *run, const vh_run_options *opts, vh_diag *d);

vh_status run_open(vh_run *run, const vh_run_options *opts, vh_diag *d) {
    run_init(run, opts);
    vh_status st = recipe_load_file(&run->recipe, opts->recipe_path, d);
    if (st != VH_STATUS_OK) return st;
    return run_open_loaded(run, opts, d);
}

vh_status run_open_text(vh_run *run, const char *name, const char *text,
                        const vh_run_options *opts, vh_diag *d) {
    run_init(run, opts);
    vh_status st = recipe_load_string(&run->recipe, name, text, strlen(text), d);
    if (st != VH_STATUS_OK) return st;
    return run_open_loaded(run, opts, d);
}

/* Mixup/CutMix (the data section's shared keys, vh_mix.h) train on soft
 * targets in vh_batch, which a model older than ABI 2.2 would not read: it
 * would train silently on the unmixed labels of mixed images. */
static vh_status check_mixing(vh_run *run, vh_diag *d) {
    const char *keys[] = {"mixup_alpha", "cutmix_alpha"};
    const vh_plugin_descriptor *model = run->plugins[VH_ROLE_MODEL].desc;
    for (int i = 0; i < 2; i++) {
        const vh_config_entry *e = config_find(&run->configs[VH_ROLE_DATA], keys[i]);
        if (!e || !e->has_value || !(e->as.f > 0.0) || model->abi_minor >= 2) continue;
        const vh_recipe_section *s = recipe_find_section(&run->recipe, "data");
        const vh_recipe_value *v = s ? recipe_find_value(s, keys[i]) : NULL;
        return recipe_diag_value(&run->recipe, s, v, 0, d, VH_STATUS_ERR_CONFIG,
                                 "data.%s: %s needs a model plugin of ABI 2.2 or later, which "
                                 "trains on the soft targets; model plugin '%s' (%s) was built "
                                 "for ABI %u.%u and would train on the unmixed labels: set "
                                 "data.%s: 0 or rebuild the model plugin against this SDK",
                                 keys[i], i ? "CutMix" : "Mixup", model->name,
                                 run->plugins[VH_ROLE_MODEL].path, model->abi_major,
                                 model->abi_minor, keys[i]);
    }
    return VH_STATUS_OK;
}

static vh_status run_open_loaded(vh_run *run, const vh_run_options *opts, vh_diag *d) {
    vh_status st;
    for (int i = 0; i < opts->num_sets; i++) {
        st = recipe_apply_set(&run->recipe, opts->sets[i], d);
        if (st != VH_STATUS_OK) return st;
    }
    st = config_resolve(&run->run_config, &run->recipe, "run", vh_run_schema, NULL, d);
    if (st != VH_STATUS_OK) return st;
    st = plugin_path_init(&run->path, NULL, d);
    if (st != VH_STATUS_OK) return st;
    for (int r = 0; r < VH_HOST_ROLE_COUNT; r++) {
        st = open_role(run, (vh_role)r, d);
        if (st != VH_STATUS_OK) return st;
    }
    return check_mixing(run, d);
}

void run_close(vh_run *run) {
    for (int r = 0; r < VH_HOST_ROLE_COUNT; r++) {
        config_free(&run->configs[r]);
        loader_close(&run->plugins[r]);
    }
    run_close_backends(run);
    plugin_path_free(&run->path);
    config_free(&run->run_config);
    recipe_free(&run->recipe);
    memset(run, 0, sizeof *run);
}

/* Quotes a scalar when plain YAML would read it differently. */
static void print_scalar(FILE *out, const char *text) {
    int plain = text[0] != '\0' && text[0] != ' ' && text[strlen(text) - 1] != ' ' &&
                !strpbrk(text, ":#{}[],&*!|>'\"%@`\\\t\n") && text[0] != '-' && text[0] != '?';
    if (plain) {
        fputs(text, out);
        return;
    }
    fputc('"', out);
    for (const char *c = text; *c; c++) {
        if (*c == '"' || *c == '\\') fputc('\\', out);
        if (*c == '\n') {
            fputs("\\n", out);
            continue;
        }
        if (*c == '\t') {
            fputs("\\t", out);
            continue;
        }
        fputc(*c, out);
    }
    fputc('"', out);
}

static void print_origin(FILE *out, const vh_config_origin *o) {
    switch (o->source) {
    case VH_CONFIG_SOURCE_RECIPE:
        fprintf(out, "  # %s:%d:%d", o->file ? o->file : "?", o->line, o->column);
        break;
    case VH_CONFIG_SOURCE_SET: fputs("  # --set", out); break;
    case VH_CONFIG_SOURCE_DEFAULT: fputs("  # default", out); break;
    }
}

static void print_section(FILE *out, const vh_section_config *c) {
    for (int i = 0; i < c->count; i++) {
        const vh_config_entry *e = &c->entries[i];
        if (!e->has_value) {
            fprintf(out, "  # %s: (not set; optional)\n", e->key->key);
            continue;
        }
        fprintf(out, "  %s: ", e->key->key);
        print_scalar(out, e->text);
        print_origin(out, &e->origin);
        fputc('\n', out);
    }
}

void run_print_resolved(const vh_run *run, FILE *out) {
    fprintf(out, "# resolved recipe of %s\n", run->recipe.file);
    fprintf(out, "run:\n");
    print_section(out, &run->run_config);
    for (int r = 0; r < VH_HOST_ROLE_COUNT; r++) {
        const vh_plugin *p = &run->plugins[r];
        const char *section = recipe_role_section((vh_role)r);
        const vh_recipe_value *v =
            recipe_find_value(recipe_find_section(&run->recipe, section), "plugin");
        fprintf(out, "%s:\n  plugin: ", section);
        print_scalar(out, v ? v->text : p->desc->name);
        if (v) print_origin(out, &v->origin);
        fprintf(out, " -> %s %s (%s, ABI %u.%u)\n", p->desc->name, p->desc->version, p->path,
                p->desc->abi_major, p->desc->abi_minor);
        print_section(out, &run->configs[r]);
    }
}
