/* cli.c - `vithost run | check | plugins`, --help, --version. */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"
#include "vtables.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "loader.h"
#include "runtime.h"
#include "eval_command.h"
#include "train_loop.h"
#include "new_plugin.h"
#include "session.h"
#include "bench_command.h"
#include "plot.h"
#include "sweep.h"

#ifndef VITHOST_VERSION
#define VITHOST_VERSION "0.0.0"
#endif

static const char usage_text[] =
    "usage: vithost run RECIPE [--set SECTION.KEY=VALUE]... [--out DIR [--resume]]\n"
    "                          [--stop-after STEPS] [--trace]\n"
    "       vithost eval RECIPE --checkpoint PATH [--set SECTION.KEY=VALUE]...\n"
    "       vithost check RECIPE [--set SECTION.KEY=VALUE]...\n"
    "       vithost plugins [--describe NAME]\n"
    "       vithost bench RECIPE [--steps N] [--warmup K] [--json] [--set ...]\n"
    "       vithost sweep RECIPE (--vary KEY=V1,V2 ... | --sequence --step KEY=V[,KEY=V]...)\n"
    "                            [--np N] [--steps N] [--out DIR]\n"
    "       vithost plot RUN_DIR... -o FILE.svg\n"
    "       vithost new-plugin ROLE NAME [DIR]\n"
    "       vithost --help | --version\n";

static const char help_text[] =
    "vithost trains Vision Transformers from a YAML recipe that names one plugin per role\n"
    "(model, precision, sharding, optim, data).\n"
    "\n"
    "commands:\n"
    "  run RECIPE      train as the recipe says; progress lines go to stdout, and the run\n"
    "                  folder gets recipe.yaml, run.json, metrics.jsonl and checkpoints/\n"
    "  eval RECIPE     evaluate weights on the eval split; prints one JSON object\n"
    "  check RECIPE    check the recipe, load every plugin it names, and print the\n"
    "                  resolved recipe with the origin of each value; trains nothing\n"
    "  plugins         list the plugins on the search path (role, version, file)\n"
    "  new-plugin ROLE NAME [DIR]  write a plugin project to start from (DIR: ./NAME):\n"
    "                  NAME.c for the role, CMakeLists.txt, a recipe, a README\n"
    "  bench RECIPE    time training steps: img/s, TFLOP/s, MFU, memory, time per phase\n"
    "  sweep RECIPE    bench every combination of --vary values (or a cumulative\n"
    "                  --sequence of --step changes); writes sweep.md, .svg and .json\n"
    "  plot RUN_DIR... loss, accuracy and img/s of runs overlaid in one SVG\n"
    "                  (`vithost bench|sweep|plot --help` for their options)\n"
    "\n"
    "options:\n"
    "  --set SECTION.KEY=VALUE   override one recipe value (checked like the file's);\n"
    "                            repeatable, e.g. --set model.depth=6\n"
    "  --out DIR                 the run folder (default runs/<recipe>-<date>-<time>)\n"
    "  --resume                  continue the run in --out DIR from its latest checkpoint\n"
    "  --stop-after STEPS        stop after STEPS steps with a checkpoint (resumable)\n"
    "  --trace                   print every plugin call of the run, in order\n"
    "  --checkpoint PATH         (eval) a run folder, a checkpoint folder or a .safetensors\n"
    "  --describe NAME           (plugins) print one plugin's config schema\n"
    "  -h, --help                this text\n"
    "  --version                 vithost and plugin ABI versions\n"
    "\n"
    "plugin search path, first match wins: $VITHOST_PLUGIN_PATH (colon-separated),\n"
    "<vithost dir>/plugins, <vithost dir>/../lib/vithost/plugins, the install prefix.\n"
    "A recipe's `plugin:` value ending in .so is a file path; any other is a name.\n"
    "\n"
    "exit codes:\n"
    "  0  success\n"
    "  1  the run failed (a plugin, the device, the communicator or the data reported\n"
    "     an error)\n"
    "  2  usage error on the command line\n"
    "  3  the recipe or a --set is invalid\n"
    "  4  a plugin could not be found, loaded or accepted\n"
    "  5  the run stopped early (signal or --stop-after) after writing a checkpoint\n"
    "\n"
    "SIGINT or SIGTERM during a run writes a checkpoint and exits with 5; a second\n"
    "SIGINT ends the process at once.\n";

typedef struct cli_args {
    const char *command;
    const char *recipe;
    const char **sets;
    int num_sets;
    const char *out_dir;
    const char *describe;
    const char *checkpoint;
    int trace, resume;
    long long stop_after;
} cli_args;

static int usage_error(FILE *err, const char *fmt, const char *arg) {
    fputs("vithost: ", err);
    fprintf(err, fmt, arg);
    fputs("\n", err);
    fputs(usage_text, err);
    return VH_EXIT_USAGE;
}

/* Options may come before or after the recipe; each option's value is the
 * next argument, or follows '='. */
static int parse_args(int argc, char **argv, cli_args *a, FILE *err) {
    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i];
        const char *value = NULL;
        const char *name = arg;
        char flag[32];
        const char *eq = strchr(arg, '=');
        if (strncmp(arg, "--", 2) == 0 && eq && (size_t)(eq - arg) < sizeof flag) {
            memcpy(flag, arg, (size_t)(eq - arg));
            flag[eq - arg] = '\0';
            name = flag;
            value = eq + 1;
        }
        int takes_value = strcmp(name, "--set") == 0 || strcmp(name, "--out") == 0 ||
                          strcmp(name, "--describe") == 0 || strcmp(name, "--checkpoint") == 0 ||
                          strcmp(name, "--stop-after") == 0;
        if (takes_value && !value) {
            if (i + 1 >= argc) return usage_error(err, "%s needs a value", name);
            value = argv[++i];
        }
        int allowed_run = strcmp(a->command, "run") == 0;
        int allowed_eval = strcmp(a->command, "eval") == 0;
        int allowed_recipe = allowed_run || allowed_eval || strcmp(a->command, "check") == 0;
        if (strcmp(name, "--set") == 0 && allowed_recipe) {
            a->sets[a->num_sets++] = value;
        } else if (strcmp(name, "--out") == 0 && allowed_run) {
            a->out_dir = value;
        } else if (strcmp(name, "--trace") == 0 && allowed_run && !value) {
            a->trace = 1;
        } else if (strcmp(name, "--resume") == 0 && allowed_run && !value) {
            a->resume = 1;
        } else if (strcmp(name, "--stop-after") == 0 && allowed_run) {
            char *end;
            a->stop_after = strtoll(value, &end, 10);
            if (*end || a->stop_after < 1)
                return usage_error(err, "--stop-after needs a positive number of steps, not '%s'",
                                   value);
        } else if (strcmp(name, "--checkpoint") == 0 && allowed_eval) {
            a->checkpoint = value;
        } else if (strcmp(name, "--describe") == 0 && strcmp(a->command, "plugins") == 0) {
            a->describe = value;
        } else if (arg[0] == '-') {
            return usage_error(err, "unknown option '%s' for this command", arg);
        } else if (allowed_recipe && !a->recipe) {
            a->recipe = arg;
        } else {
            return usage_error(err, "unexpected argument '%s'", arg);
        }
    }
    if (strcmp(a->command, "plugins") != 0 && !a->recipe)
        return usage_error(err, "'%s' needs a RECIPE file", a->command);
    if (strcmp(a->command, "eval") == 0 && !a->checkpoint)
        return usage_error(err, "'%s' needs --checkpoint PATH", a->command);
    if (a->resume && !a->out_dir)
        return usage_error(err, "%s needs --out DIR (the run folder to continue)", "--resume");
    return VH_EXIT_OK;
}

static int open_exit_code(const vh_run *run, vh_status st) {
    if (run->load_failed) return VH_EXIT_PLUGIN;
    return st == VH_STATUS_ERR_NOMEM ? VH_EXIT_RUN_FAILED : VH_EXIT_RECIPE;
}

/* Creates the five plugins as a run does (device and communicator, data
 * and its info, precision, the model against both, optim, sharding), then
 * destroys them: no weights are loaded and no step is taken, but every
 * rule a plugin checks against the others' info (heads dividing dim, the
 * patch dividing the images, the data being there) is checked. */
static vh_status check_plugins(vh_run *run, const char *recipe, FILE *out, vh_diag *d) {
    vh_session s;
    FILE *saved = run->opts.out;
    run->opts.out = out;
    vh_status st = session_open(&s, run, d);
    if (st == VH_STATUS_OK && s.info.train_size / run->comm.world_size / s.batch_size < 1)
        st = diag_set(d, VH_STATUS_ERR_CONFIG,
                      "%s: the training split has %lld samples, fewer than one batch of %lld "
                      "per rank on %d rank(s); lower run.batch_size",
                      run->recipe.file, (long long)s.info.train_size, (long long)s.batch_size,
                      (int)run->comm.world_size);
    if (st == VH_STATUS_OK)
        fprintf(out,
                "# %s: ok (recipe and schemas; plugins created against each other on %s: "
                "data %lld train / %lld eval images %d x %d x %d, %d classes; model %lld "
                "parameters; no weights loaded, nothing trained)\n",
                recipe, run->device->name, (long long)s.info.train_size,
                (long long)s.info.eval_size, (int)s.info.channels, (int)s.info.height,
                (int)s.info.width, (int)s.info.num_classes, (long long)s.table->numel);
    session_close(&s);
    run->opts.out = saved;
    return st;
}

static int cmd_check(const cli_args *a, FILE *out, FILE *err) {
    vh_run run;
    vh_diag d = {{0}};
    vh_run_options opts = {.recipe_path = a->recipe, .sets = a->sets, .num_sets = a->num_sets,
                           .out = out};
    vh_status st = run_open(&run, &opts, &d);
    if (st != VH_STATUS_OK) {
        fprintf(err, "%s\n", d.text);
        int code = open_exit_code(&run, st);
        run_close(&run);
        return code;
    }
    run_print_resolved(&run, out);
    /* What `run` would refuse before its first step: the plugins created
     * against each other's info. */
    vh_status cst = check_plugins(&run, a->recipe, out, &d);
    run_close(&run);
    if (cst != VH_STATUS_OK) {
        fprintf(err, "vithost: %s\n", d.text);
        return cst == VH_STATUS_ERR_CONFIG ? VH_EXIT_RECIPE : VH_EXIT_RUN_FAILED;
    }
    return VH_EXIT_OK;
}

static int run_exit_code(vh_status st) {
    switch (st) {
    case VH_STATUS_OK: return VH_EXIT_OK;
    case VH_STATUS_ERR_CONFIG: return VH_EXIT_RECIPE;
    case VH_STATUS_ERR_INTERRUPTED: return VH_EXIT_STOPPED;
    default: return VH_EXIT_RUN_FAILED;
    }
}

static int cmd_run(const cli_args *a, FILE *out, FILE *err) {
    vh_run run;
    vh_diag d = {{0}};
    vh_run_options opts = {.recipe_path = a->recipe, .sets = a->sets, .num_sets = a->num_sets,
                           .out_dir = a->out_dir, .trace = a->trace, .out = out};
    vh_status st = run_open(&run, &opts, &d);
    if (st != VH_STATUS_OK) {
        fprintf(err, "%s\n", d.text);
        int code = open_exit_code(&run, st);
        run_close(&run);
        return code;
    }
    vh_train_options to = {.out_dir = a->out_dir, .resume = a->resume,
                           .stop_after = a->stop_after};
    st = train_run(&run, &to, &d);
    /* Of many ranks, rank 0 says how the run ended (the others stopped at
     * the same step for the same reason). */
    int say = run.comm.rank == 0 || st != VH_STATUS_ERR_INTERRUPTED;
    run_close(&run);
    if (st != VH_STATUS_OK && say) fprintf(err, "vithost: %s\n", d.text);
    return run_exit_code(st);
}

static int cmd_eval(const cli_args *a, FILE *out, FILE *err) {
    vh_run run;
    vh_diag d = {{0}};
    vh_run_options opts = {.recipe_path = a->recipe, .sets = a->sets, .num_sets = a->num_sets,
                           .out = err}; /* stdout carries only the JSON */
    vh_status st = run_open(&run, &opts, &d);
    if (st != VH_STATUS_OK) {
        fprintf(err, "%s\n", d.text);
        int code = open_exit_code(&run, st);
        run_close(&run);
        return code;
    }
    st = eval_command(&run, a->checkpoint, out, &d);
    run_close(&run);
    if (st != VH_STATUS_OK) fprintf(err, "vithost: %s\n", d.text);
    return run_exit_code(st);
}

static void print_schema(const vh_plugin_descriptor *desc, FILE *out) {
    fprintf(out, "%s (%s plugin, version %s, ABI %u.%u)\n  %s\n\nkeys of section '%s':\n",
            desc->name, vh_role_name(desc->role), desc->version, desc->abi_major,
            desc->abi_minor, desc->description, vh_role_name(desc->role));
    int any = 0;
    for (const vh_config_key *k = desc->schema; k->key; k++) {
        any = 1;
        fprintf(out, "  %-18s %-6s ", k->key, config_type_name(k->type));
        if (k->default_value)
            fprintf(out, "default %s", k->default_value);
        else if (k->flags & VH_CONFIG_KEY_FLAG_OPTIONAL)
            fputs("optional", out);
        else
            fputs("required", out);
        if (k->type == VH_CONFIG_TYPE_ENUM && k->choices) fprintf(out, ", one of %s", k->choices);
        if ((k->type == VH_CONFIG_TYPE_INT || k->type == VH_CONFIG_TYPE_FLOAT) && k->min < k->max)
            fprintf(out, ", range [%g, %g]", k->min, k->max);
        fprintf(out, "\n      %s\n", k->doc ? k->doc : "");
    }
    if (!any) fputs("  (none besides `plugin`)\n", out);
}

static int cmd_plugins(const cli_args *a, FILE *out, FILE *err) {
    vh_plugin_path path;
    vh_diag d = {{0}};
    if (plugin_path_init(&path, NULL, &d) != VH_STATUS_OK) {
        fprintf(err, "vithost: %s\n", d.text);
        return VH_EXIT_PLUGIN;
    }
    int code = VH_EXIT_OK;
    if (a->describe) {
        vh_plugin p;
        memset(&p, 0, sizeof p);
        vh_status st = loader_resolve(&p, &path, a->describe, -1, &d);
        if (st == VH_STATUS_OK) {
            print_schema(p.desc, out);
            fprintf(out, "\nfile: %s\n", p.path);
            loader_close(&p);
        } else {
            fprintf(err, "vithost: %s\n", d.text);
            code = VH_EXIT_PLUGIN;
        }
        plugin_path_free(&path);
        return code;
    }
    vh_plugin_info *infos = NULL;
    int count = 0;
    char *problems = NULL;
    vh_status st = plugin_scan(&path, &infos, &count, &problems, &d);
    if (st != VH_STATUS_OK) {
        fprintf(err, "vithost: %s\n", d.text);
        code = VH_EXIT_PLUGIN;
    } else {
        fprintf(out, "search path:\n");
        for (int i = 0; i < path.count; i++) fprintf(out, "  %s\n", path.dirs[i]);
        fprintf(out, "\n%-10s %-16s %-8s %s\n", "ROLE", "NAME", "VERSION", "FILE");
        for (int r = 0; r < VH_HOST_ROLE_COUNT; r++) {
            for (int i = 0; i < count; i++) {
                if (infos[i].role != (vh_role)r) continue;
                fprintf(out, "%-10s %-16s %-8s %s%s%s\n", vh_role_name(infos[i].role),
                        infos[i].name, infos[i].version, infos[i].path,
                        infos[i].shadowed_by ? "  (shadowed by " : "",
                        infos[i].shadowed_by ? infos[i].shadowed_by : "");
                if (infos[i].shadowed_by) fputs(")", out);
                fprintf(out, "%-10s %-16s %s\n", "", "", infos[i].description);
            }
        }
        if (count == 0) fprintf(out, "(no plugins found)\n");
        fprintf(out, "\n`vithost plugins --describe NAME` prints a plugin's config keys.\n");
        if (problems && problems[0])
            fprintf(err, "vithost: files on the search path that are not usable plugins:\n%s",
                    problems);
    }
    free(problems);
    plugin_infos_free(infos, count);
    plugin_path_free(&path);
    return code;
}

int cli_main(int argc, char **argv, FILE *out, FILE *err) {
    if (argc < 2) {
        fputs(usage_text, err);
        return VH_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        fputs(usage_text, out);
        fputc('\n', out);
        fputs(help_text, out);
        return VH_EXIT_OK;
    }
    if (strcmp(cmd, "--version") == 0) {
        fprintf(out, "vithost %s (plugin ABI %d.%d)\n", VITHOST_VERSION, VH_ABI_MAJOR,
                VH_ABI_MINOR);
        return VH_EXIT_OK;
    }
    if (strcmp(cmd, "bench") == 0) return bench_main(argc, argv, out, err);
    if (strcmp(cmd, "sweep") == 0) return sweep_main(argc, argv, out, err);
    if (strcmp(cmd, "plot") == 0) return plot_main(argc, argv, out, err);
    if (strcmp(cmd, "new-plugin") == 0) return new_plugin_command(argc - 2, argv + 2, out, err);
    if (strcmp(cmd, "run") != 0 && strcmp(cmd, "check") != 0 && strcmp(cmd, "plugins") != 0 &&
        strcmp(cmd, "eval") != 0)
        return usage_error(err, "unknown command '%s'", cmd);
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(usage_text, out);
            return VH_EXIT_OK;
        }
    }
    cli_args a;
    memset(&a, 0, sizeof a);
    a.command = cmd;
    a.sets = calloc((size_t)argc, sizeof *a.sets);
    if (!a.sets) return VH_EXIT_RUN_FAILED;
    int code = parse_args(argc, argv, &a, err);
    if (code == VH_EXIT_OK) {
        if (strcmp(cmd, "run") == 0) code = cmd_run(&a, out, err);
        else if (strcmp(cmd, "eval") == 0) code = cmd_eval(&a, out, err);
        else if (strcmp(cmd, "check") == 0) code = cmd_check(&a, out, err);
        else code = cmd_plugins(&a, out, err);
    }
    free(a.sets);
    return code;
}
