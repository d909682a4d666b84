/* harness.h - what the tests that run the vithost executable share: a shell
 * command run in a folder with its output captured, a file read whole, a
 * number field of a JSON line. */
#ifndef VITHOST_TESTS_HARNESS_H
#define VITHOST_TESTS_HARNESS_H

#include <stddef.h>
#include <stdint.h>

/* The whole file, NUL-terminated (free it); "" when it cannot be opened. */
char *harness_slurp(const char *path);
/* harness_slurp of dir/name. */
char *harness_read(const char *dir, const char *name);
/* Runs the shell command in dir, stdin from /dev/null, stdout into dir/out
 * and stderr into dir/err; its exit code, -1 when it did not exit. */
int harness_sh(const char *dir, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A fresh folder /tmp/vithost-test-<name>-XXXXXX into dir (dir_len bytes);
 * 0 on success. harness_rmdir removes it and all it holds; 0 on success. */
int harness_mkdtemp(char *dir, size_t dir_len, const char *name);
int harness_rmdir(const char *dir);
/* Writes text into dir/name, replacing it; 0 on success. */
int harness_write(const char *dir, const char *name, const char *text);
/* A recipe of a ViT small enough that a step takes a millisecond (vit, fp32,
 * ddp, mta, synthetic data; 8 steps): what the command tests run. */
extern const char harness_tiny_vit[];
/* The number after "key": in a JSON line; NAN when absent. */
double harness_json_number(const char *line, const char *key);
/* Every tensor of a safetensors file as f32, end to end in the file's
 * (sorted) order, so two files of one model line up (free it); NULL with a
 * message in err when the file cannot be read. */
float *harness_safetensors_f32(const char *path, int64_t *n, char *err, size_t err_len);

#endif
