/* check_command.c - `vithost check`: the recipe resolved and printed with
 * the origin of each value, then the plugins created against each other;
 * nothing trained. */
#include "command.h"
#include "session.h"

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
    const int64_t k = s.grad_accum > 1 ? s.grad_accum : 1, world = run->comm.world_size;
    if (st == VH_STATUS_OK && s.info.train_size / world / s.batch_size / k < 1)
        st = diag_set(d, VH_STATUS_ERR_CONFIG,
                      "%s: the training split has %lld samples, fewer than one step of %lld "
                      "x %lld (run.batch_size x run.grad_accum) per rank on %d rank(s); lower "
                      "run.batch_size or run.grad_accum",
                      run->recipe.file, (long long)s.info.train_size, (long long)s.batch_size,
                      (long long)k, (int)world);
    if (st == VH_STATUS_OK)
        fprintf(out,
                "# %s: ok (recipe and schemas; plugins created against each other on %s: "
                "data %lld train / %lld eval images %d x %d x %d, %d classes; model %lld "
                "parameters; global batch %lld = %lld x %lld micro-batch(es) x %d rank(s); "
                "no weights loaded, nothing trained)\n",
                recipe, run->device->name, (long long)s.info.train_size,
                (long long)s.info.eval_size, (int)s.info.channels, (int)s.info.height,
                (int)s.info.width, (int)s.info.num_classes, (long long)s.table->numel,
                (long long)(s.batch_size * k * world), (long long)s.batch_size, (long long)k,
                (int)world);
    session_close(&s);
    run->opts.out = saved;
    return st;
}

int check_main(const cli_args *a, FILE *out, FILE *err) {
    vh_run run;
    vh_run_options opts = {.recipe_path = a->recipe, .sets = a->sets, .num_sets = a->num_sets,
                           .out = out};
    int code = command_open_run(&run, &opts, err);
    if (code != VH_EXIT_OK) return code;
    run_print_resolved(&run, out);
    /* What `run` would refuse before its first step: the plugins created
     * against each other's info. */
    vh_diag d = {{0}};
    vh_status st = check_plugins(&run, a->recipe, out, &d);
    run_close(&run);
    if (st != VH_STATUS_OK) {
        fprintf(err, "vithost: %s\n", d.text);
        return st == VH_STATUS_ERR_CONFIG ? VH_EXIT_RECIPE : VH_EXIT_RUN_FAILED;
    }
    return VH_EXIT_OK;
}
