/* ema.h - an exponential moving average of the weights (timm's ModelEmaV2
 * update, TensorFlow's ExponentialMovingAverage warm-up), kept by the host.
 *
 * Recipe keys (optim section, host-owned: the SDK's shared optimizer keys):
 *   optim.ema_decay         0 = off; else in (0, 1)
 *   optim.ema_warmup_steps  optimizer steps with the warm-up decay
 *   optim.ema_every         update every this many optimizer steps
 *
 * After optimizer step t (1-based, the step count once it is done), when
 * the step was not skipped (overflow) and t % every == 0:
 *
 *   d_t = min(decay, (1 + n) / (10 + n))   while t <= warmup_steps
 *   d_t = decay                            after
 *   ema = ema + (1 - d_t) * (w - ema)      (fp32, = d_t ema + (1 - d_t) w)
 *
 * n: the EMA updates made before this one (0 at the first). The average
 * starts as the run's starting weights (timm copies the model at creation).
 *
 * One fp32 value per master element this rank owns: one buffer per slice of
 * the sharding plugin's list (FSDP: this rank's shard; DDP: all of it, the
 * same on every rank). It lives in host memory; on a non-CPU device the
 * masters come through a staging copy.
 *
 * Evaluating or saving the average swaps it into the masters (ema_swap,
 * then sharding.refresh, so the compute copies and any gathered copies
 * follow), and swaps back the same way: the raw weights come back bit for
 * bit. A checkpoint carries it as ema.safetensors, written like
 * model.safetensors (the model's names, F32): the run's EMA weights file.
 */
#ifndef VITHOST_HOST_EMA_H
#define VITHOST_HOST_EMA_H

#include <stdint.h>

#include "session.h"

typedef struct vh_ema_config {
    double decay;           /* 0: off */
    int64_t warmup_steps, every;
} vh_ema_config;

typedef struct vh_ema {
    vh_ema_config cfg;
    int64_t updates;        /* n: updates made so far (saved in state.json) */
    int32_t count;          /* slices */
    float *values;          /* every slice's average, end to end */
    int64_t *first;         /* per slice: its first value in `values` */
    float *staging;         /* non-CPU device: one slice's masters */
} vh_ema;

/* The decay of the update after optimizer step `step` when `updates`
 * updates were made before it. */
double ema_decay_at(const vh_ema_config *c, int64_t step, int64_t updates);
/* Whether optimizer step `step` (1-based) updates the average. */
int ema_due(const vh_ema_config *c, int64_t step, int skipped);
/* ema += (1 - decay) * (w - ema) over n values. */
void ema_lerp(float *ema, const float *w, int64_t n, double decay);

/* Reads the keys; e->cfg.decay 0 (and nothing allocated) when off. Refuses
 * masters that are not f32 with a message naming the key. */
vh_status ema_init(vh_ema *e, vh_session *s, vh_diag *d);
void ema_free(vh_ema *e);
/* The average := the masters (the start of a fresh run). */
vh_status ema_reset(vh_ema *e, vh_session *s, vh_diag *d);
/* After a step: updates the average when due. */
vh_status ema_step(vh_ema *e, vh_session *s, int64_t step, int skipped, vh_diag *d);
/* Exchanges the masters and the average, then sharding.refresh; twice
 * restores both. Collective under sharding plugins whose refresh is. */
vh_status ema_swap(vh_ema *e, vh_session *s, vh_diag *d);

/* Makes the session's checkpoints carry the average (s->ckpt_extra). */
void ema_attach(vh_ema *e, vh_session *s);

#endif
