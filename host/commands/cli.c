/* cli.c - the vithost command line: --help, --version, the options of
 * `run`, `eval`, `check` and `plugins` (parsed here into cli_args), and the
 * dispatch to each command's file. bench, sweep, plot and new-plugin parse
 * their own options. */
#define _POSIX_C_SOURCE 200809L
#include "cli.h"

#include <stdlib.h>
#include <string.h>

#include "bench_command.h"
#include "command.h"
#include "new_plugin.h"
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
    "  --set 'SECTION={k: v, ...}'  replace a whole section, e.g.\n"
    "                            --set 'optim={plugin: lion, lr: 6e-3}'\n"
    "  --out DIR                 the run folder (default runs/<recipe>-<date>-<time>)\n"
    "  --resume                  continue the run in --out DIR from its latest checkpoint\n"
    "  --stop-after STEPS        stop after STEPS steps with a checkpoint (resumable)\n"
    "  --trace                   print every plugin call of the run, in order\n"
    "  --checkpoint PATH         (eval) a run folder, a checkpoint folder or a .safetensors\n"
    "  --describe NAME           (plugins) print one plugin's config schema, or run's\n"
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

static int new_plugin_main(int argc, char **argv, FILE *out, FILE *err) {
    return new_plugin_command(argc - 2, argv + 2, out, err);
}

/* The commands that read their own options from argv (argv[1]: the name). */
static const struct {
    const char *name;
    int (*main)(int argc, char **argv, FILE *out, FILE *err);
} own_options[] = {
    {"bench", bench_main},
    {"sweep", sweep_main},
    {"plot", plot_main},
    {"new-plugin", new_plugin_main},
};

/* The commands whose options parse_args reads. */
static const struct {
    const char *name;
    int (*main)(const cli_args *a, FILE *out, FILE *err);
} parsed[] = {
    {"run", run_main},
    {"eval", eval_main},
    {"check", check_main},
    {"plugins", plugins_main},
};

#define COUNT(a) (int)(sizeof(a) / sizeof((a)[0]))

/* A parsed command: --help anywhere prints the usage; else its options. */
static int parse_and_run(int which, int argc, char **argv, FILE *out, FILE *err) {
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(usage_text, out);
            return VH_EXIT_OK;
        }
    }
    cli_args a;
    memset(&a, 0, sizeof a);
    a.command = parsed[which].name;
    a.sets = calloc((size_t)argc, sizeof *a.sets);
    if (!a.sets) return VH_EXIT_RUN_FAILED;
    int code = parse_args(argc, argv, &a, err);
    if (code == VH_EXIT_OK) code = parsed[which].main(&a, out, err);
    free(a.sets);
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
    for (int i = 0; i < COUNT(own_options); i++)
        if (strcmp(cmd, own_options[i].name) == 0) return own_options[i].main(argc, argv, out, err);
    for (int i = 0; i < COUNT(parsed); i++)
        if (strcmp(cmd, parsed[i].name) == 0) return parse_and_run(i, argc, argv, out, err);
    return usage_error(err, "unknown command '%s'", cmd);
}
