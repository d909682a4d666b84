/* fuzz_util.h - what the fuzz targets share: a scratch folder, writing the
 * input to files, a data plugin opened as vithost opens it, and the oracle.
 *
 * Every target defines LLVMFuzzerInitialize (setup once, before the first
 * input: plugins are dlopen'ed there so libFuzzer sees their coverage) and
 * LLVMFuzzerTestOneInput. The same sources link either with libFuzzer
 * (VH_FUZZ) or with replay_main.c, which feeds the files of the folders it
 * is given (fuzz/corpus, fuzz/regressions) through the same two functions.
 *
 * The oracle beyond the sanitizers: bad input must fail with one message, so
 * a failure with an empty message aborts (fuzz_require).
 */
#ifndef VITHOST_FUZZ_UTIL_H
#define VITHOST_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "runtime.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A fresh folder under $TMPDIR (or /tmp), removed at exit. */
const char *fuzz_scratch_dir(void);
/* Writes bytes to dir/name; aborts when it cannot (not the input's fault). */
void fuzz_write_file(const char *dir, const char *name, const void *bytes, size_t size);
/* Aborts with the message when cond is false: a finding, like a sanitizer's. */
void fuzz_require(int cond, const char *what, const char *detail);

/* A run whose data section is `data_section` (flow YAML) with the test
 * plugins in the other roles, its data plugin's vtable and host. */
typedef struct fuzz_data_run {
    vh_run run;
    const vh_data_vtable *vt;
    vh_host *host;
} fuzz_data_run;

void fuzz_data_open(fuzz_data_run *r, const char *data_section);
/* create + info + first batch of each split + destroy. Returns create's
 * status; a failure must carry a message. */
vh_status fuzz_data_cycle(fuzz_data_run *r);

#endif
