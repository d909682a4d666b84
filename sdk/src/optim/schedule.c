/* schedule.c - the optimizer keys every optimizer shares and their
 * learning-rate schedule: warm-up, then cosine, step or constant
 * (vh_optim_schedule.h has the formulas). */
#include <math.h>
#include <string.h>

#include "vithost/vh_optim_schedule.h"

#define VH_PI 3.14159265358979323846

const vh_config_key vh_optim_shared_keys[] = {
    {"lr", VH_CONFIG_TYPE_FLOAT, "1e-3", "peak learning rate, reached at the end of warm-up",
     NULL, 0, 100, 0},
    {"weight_decay", VH_CONFIG_TYPE_FLOAT, "0.05",
     "weight decay of parameters flagged for decay (how it applies is the optimizer's: "
     "decoupled for adamw, L2 for sgd)",
     NULL, 0, 1, 0},
    {"schedule", VH_CONFIG_TYPE_ENUM, "cosine",
     "learning rate after warm-up: cosine to min_lr at the last step, step (x step_gamma "
     "every step_size steps), constant",
     "cosine|step|constant", 0, 0, 0},
    {"warmup_steps", VH_CONFIG_TYPE_INT, "0",
     "linear warm-up steps from warmup_init_lr (step 0) to lr (step warmup_steps)", NULL, 0,
     1e15, 0},
    {"warmup_init_lr", VH_CONFIG_TYPE_FLOAT, "0", "learning rate of step 0 when warming up",
     NULL, 0, 100, 0},
    {"min_lr", VH_CONFIG_TYPE_FLOAT, "0", "cosine: the last step's learning rate, <= lr", NULL,
     0, 100, 0},
    {"step_size", VH_CONFIG_TYPE_INT, "1000", "step: steps (after warm-up) between decays",
     NULL, 1, 1e15, 0},
    {"step_gamma", VH_CONFIG_TYPE_FLOAT, "0.1", "step: decay factor, in (0, 1]", NULL, 0, 1, 0},
    {"clip_grad_norm", VH_CONFIG_TYPE_FLOAT, "0",
     "clip the global gradient 2-norm (all ranks) to this value; 0 = off", NULL, 0, 1e9, 0},
    /* Read by the host, not the optimizer: the EMA of the weights
     * (host/train/ema.h), evaluated and saved beside the raw weights. */
    {"ema_decay", VH_CONFIG_TYPE_FLOAT, "0",
     "EMA of the weights: ema = d ema + (1 - d) w after the optimizer steps it updates on, "
     "evaluated and checkpointed beside the raw weights (ema.safetensors); 0 = off, else "
     "below 1 (e.g. 0.9998)",
     NULL, 0, 1, 0},
    {"ema_warmup_steps", VH_CONFIG_TYPE_INT, "0",
     "EMA: up to this optimizer step the decay is min(ema_decay, (1 + n) / (10 + n)), n the "
     "updates made so far (TensorFlow's num_updates rule); 0 = none",
     NULL, 0, 1e15, 0},
    {"ema_every", VH_CONFIG_TYPE_INT, "1",
     "EMA: update after every this many optimizer steps (a skipped step does not update)",
     NULL, 1, 1e9, 0},
    {NULL, 0, NULL, NULL, NULL, 0, 0, 0},
};

int vh_optim_shared_key(const char *key) {
    if (!key) return 0;
    for (const vh_config_key *k = vh_optim_shared_keys; k->key; k++)
        if (strcmp(k->key, key) == 0) return 1;
    return 0;
}

const char *vh_schedule_kind_name(int32_t kind) {
    switch (kind) {
    case VH_SCHEDULE_KIND_COSINE: return "cosine";
    case VH_SCHEDULE_KIND_STEP: return "step";
    case VH_SCHEDULE_KIND_CONSTANT: return "constant";
    }
    return NULL;
}

static int kind_parse(const char *name) {
    for (int32_t k = 0; k <= VH_SCHEDULE_KIND_CONSTANT; k++)
        if (name && strcmp(name, vh_schedule_kind_name(k)) == 0) return k;
    return -1;
}

/* Getters fail only on a schema bug; the host has checked types and ranges. */
static vh_status get_float(vh_host *host, const char *key, double *out, vh_status st) {
    if (st != VH_STATUS_OK) return st;
    st = host->api->config_float(host, key, out);
    return st == VH_STATUS_OK ? st : host->api->fail(host, st, "cannot read float key '%s'", key);
}

static vh_status get_int(vh_host *host, const char *key, int64_t *out, vh_status st) {
    if (st != VH_STATUS_OK) return st;
    st = host->api->config_int(host, key, out);
    return st == VH_STATUS_OK ? st : host->api->fail(host, st, "cannot read int key '%s'", key);
}

/* What the schema's inclusive ranges cannot say. */
static vh_status check(vh_host *host, const vh_optim_schedule *s) {
    if (!(s->step_gamma > 0.0))
        return host->api->config_fail(host, "step_gamma", "%g is outside (0, 1]", s->step_gamma);
    if (s->kind == VH_SCHEDULE_KIND_COSINE && s->min_lr > s->lr)
        return host->api->config_fail(host, "min_lr", "%g is above lr %g", s->min_lr, s->lr);
    return VH_STATUS_OK;
}

vh_status vh_optim_schedule_read(vh_host *host, int64_t total_steps, vh_optim_schedule *out) {
    if (!host || !out || out->struct_size < sizeof(uint32_t)) return VH_STATUS_ERR_INVALID_ARG;
    vh_optim_schedule s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    s.total_steps = total_steps;
    const char *kind = NULL;
    vh_status st = host->api->config_string(host, "schedule", &kind);
    if (st != VH_STATUS_OK) return host->api->fail(host, st, "cannot read key 'schedule'");
    st = get_float(host, "lr", &s.lr, st);
    st = get_float(host, "weight_decay", &s.weight_decay, st);
    st = get_int(host, "warmup_steps", &s.warmup_steps, st);
    st = get_float(host, "warmup_init_lr", &s.warmup_init_lr, st);
    st = get_float(host, "min_lr", &s.min_lr, st);
    st = get_int(host, "step_size", &s.step_size, st);
    st = get_float(host, "step_gamma", &s.step_gamma, st);
    st = get_float(host, "clip_grad_norm", &s.clip_grad_norm, st);
    if (st != VH_STATUS_OK) return st;
    s.kind = kind_parse(kind);
    if (s.kind < 0)
        return host->api->config_fail(host, "schedule", "unknown schedule '%s'", kind);
    if ((st = check(host, &s)) != VH_STATUS_OK) return st;
    /* The caller's struct_size says how much of ours it has room for. */
    uint32_t room = out->struct_size;
    size_t n = room < sizeof s ? room : sizeof s;
    memcpy(out, &s, n);
    out->struct_size = (uint32_t)n;
    return VH_STATUS_OK;
}

static int set_in_recipe(vh_host *host, const char *key) {
    vh_config_origin o;
    return host->api->config_origin(host, key, &o) == VH_STATUS_OK &&
           o.source != VH_CONFIG_SOURCE_DEFAULT;
}

void vh_optim_schedule_warn(vh_host *host, const vh_optim_schedule *sched) {
    vh_optim_schedule s;
    if (!host || !vh_struct_upgrade(&s, sizeof s, sched)) return;
    if (s.kind != VH_SCHEDULE_KIND_COSINE && set_in_recipe(host, "min_lr"))
        host->api->log(host, VH_LOG_LEVEL_WARN, "min_lr is read by schedule cosine only");
    if (s.kind != VH_SCHEDULE_KIND_STEP)
        for (int i = 0; i < 2; i++) {
            const char *key = i ? "step_gamma" : "step_size";
            if (set_in_recipe(host, key))
                host->api->log(host, VH_LOG_LEVEL_WARN, "%s is read by schedule step only", key);
        }
    if (s.warmup_steps == 0 && set_in_recipe(host, "warmup_init_lr"))
        host->api->log(host, VH_LOG_LEVEL_WARN, "warmup_init_lr is ignored without warmup_steps");
    if (s.kind == VH_SCHEDULE_KIND_COSINE && s.total_steps <= s.warmup_steps)
        host->api->log(host, VH_LOG_LEVEL_WARN,
                       "the run has %lld steps and warms up for %lld: the cosine never starts",
                       (long long)s.total_steps, (long long)s.warmup_steps);
}

/* The cosine over the T - W steps after warm-up, in T - W - 1 intervals:
 * the first uses lr, the last (the run's step T - 1) min_lr, both exactly
 * (min_lr + (lr - min_lr) need not round to lr). */
static double cosine_lr(const vh_optim_schedule *s, int64_t after_warmup) {
    int64_t intervals = s->total_steps - s->warmup_steps - 1;
    if (intervals <= 0 || after_warmup >= intervals) return s->min_lr;
    if (after_warmup == 0) return s->lr;
    double x = VH_PI * (double)after_warmup / (double)intervals;
    return s->min_lr + 0.5 * (s->lr - s->min_lr) * (1.0 + cos(x));
}

double vh_optim_schedule_lr(const vh_optim_schedule *sched, int64_t t) {
    vh_optim_schedule s;
    if (!vh_struct_upgrade(&s, sizeof s, sched)) return 0.0;
    if (t < 0) t = 0;
    if (t < s.warmup_steps) {
        double per_step = (s.lr - s.warmup_init_lr) / (double)s.warmup_steps;
        return s.warmup_init_lr + (double)t * per_step;
    }
    int64_t after = t - s.warmup_steps;
    switch (s.kind) {
    case VH_SCHEDULE_KIND_COSINE: return cosine_lr(&s, after);
    case VH_SCHEDULE_KIND_STEP:
        if (s.step_size <= 0) break; /* the schema keeps it >= 1 */
        return s.lr * pow(s.step_gamma, (double)(after / s.step_size));
    default: break;
    }
    return s.lr;
}

void vh_optim_schedule_args(const vh_optim_schedule *sched, int64_t step,
                            vh_optim_step_args *args) {
    vh_optim_schedule s;
    if (!args || !vh_struct_upgrade(&s, sizeof s, sched)) return;
    args->lr = vh_optim_schedule_lr(&s, step);
    args->weight_decay = s.weight_decay;
    args->clip_grad_norm = s.clip_grad_norm;
}
