/* schedule.c - learning-rate schedules: warm-up, then cosine, step or constant. */
#include "schedule.h"

#include <math.h>
#include <string.h>

#define MTA_PI 3.14159265358979323846

int mta_schedule_kind_parse(const char *name) {
    if (!name) return -1;
    if (strcmp(name, "cosine") == 0) return MTA_SCHEDULE_KIND_COSINE;
    if (strcmp(name, "step") == 0) return MTA_SCHEDULE_KIND_STEP;
    if (strcmp(name, "constant") == 0) return MTA_SCHEDULE_KIND_CONSTANT;
    return -1;
}

/* timm's CosineLRScheduler with warmup_prefix: the cosine spans the steps
 * after warm-up, T - W of them. */
static double cosine_lr(const mta_schedule *s, int64_t after_warmup) {
    int64_t span = s->total_steps - s->warmup_steps;
    if (span <= 0 || after_warmup >= span) return s->min_lr;
    double x = MTA_PI * (double)after_warmup / (double)span;
    return s->min_lr + 0.5 * (s->lr - s->min_lr) * (1.0 + cos(x));
}

double mta_schedule_lr(const mta_schedule *s, int64_t t) {
    if (t < 0) t = 0;
    if (t < s->warmup_steps) {
        double per_step = (s->lr - s->warmup_init_lr) / (double)s->warmup_steps;
        return s->warmup_init_lr + (double)t * per_step;
    }
    int64_t after = t - s->warmup_steps;
    switch (s->kind) {
    case MTA_SCHEDULE_KIND_COSINE: return cosine_lr(s, after);
    case MTA_SCHEDULE_KIND_STEP:
        if (s->step_size <= 0) break; /* the schema keeps it >= 1 */
        return s->lr * pow(s->step_gamma, (double)(after / s->step_size));
    case MTA_SCHEDULE_KIND_CONSTANT: break;
    }
    return s->lr;
}
