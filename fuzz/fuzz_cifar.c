/* fuzz_cifar.c - the `cifar` data plugin's reading of CIFAR-10/100 batches.
 *
 * Input: the first byte picks the variant (bit 0: cifar100, bit 1: coarse
 * labels), the rest is the first training file (data_batch_1.bin or
 * train.bin) and the evaluation file. CIFAR-10's four other training files
 * hold one valid record each. The plugin, loaded as vithost loads it, is
 * created on them (workers: 0) and one batch of each split converted.
 */
#include <stdio.h>
#include <string.h>

#include "fuzz_util.h"

static fuzz_data_run runs[3]; /* cifar10, cifar100 fine, cifar100 coarse */
static char dir[4200];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    snprintf(dir, sizeof dir, "%s", fuzz_scratch_dir());
    static unsigned char record[1 + 3072];
    record[0] = 3;
    for (int b = 2; b <= 5; b++) {
        char name[32];
        snprintf(name, sizeof name, "data_batch_%d.bin", b);
        fuzz_write_file(dir, name, record, sizeof record);
    }
    const char *variants[3] = {"variant: cifar10", "variant: cifar100, labels: fine",
                               "variant: cifar100, labels: coarse"};
    for (int v = 0; v < 3; v++) {
        char section[4600];
        snprintf(section, sizeof section,
                 "{plugin: cifar, root: %s, %s, workers: 0, prefetch: 1}", dir, variants[v]);
        fuzz_data_open(&runs[v], section);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int v = data[0] & 1 ? (data[0] & 2 ? 2 : 1) : 0;
    const char *train = v ? "train.bin" : "data_batch_1.bin";
    const char *eval = v ? "test.bin" : "test_batch.bin";
    fuzz_write_file(dir, train, data + 1, size - 1);
    fuzz_write_file(dir, eval, data + 1, size - 1);
    fuzz_data_cycle(&runs[v]);
    return 0;
}
