/* fuzz_idx.c - the `idx` data plugin's reading of IDX files, plain or gzip.
 *
 * Input: an image file, optionally followed by the separator "\nVHLABELS\n"
 * and a label file (without it, the label file is empty). Both are written
 * to a scratch folder and the plugin, loaded as vithost loads it, is created
 * on them (train and eval name the same two files; workers: 0), then one
 * batch of each split is converted. Gzip streams (1f 8b) are decompressed by
 * the plugin as they would be in a data set folder.
 */
#define _GNU_SOURCE /* memmem */
#include <stdio.h>
#include <string.h>

#include "fuzz_util.h"

#define SEPARATOR "\nVHLABELS\n"

static fuzz_data_run data_run;
static char dir[4200];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    snprintf(dir, sizeof dir, "%s", fuzz_scratch_dir());
    fuzz_write_file(dir, "images", "", 0);
    fuzz_write_file(dir, "labels", "", 0);
    char section[4600];
    snprintf(section, sizeof section,
             "{plugin: idx, root: %s, train_images: images, train_labels: labels, "
             "eval_images: images, eval_labels: labels, workers: 0, prefetch: 1, pad_crop: 2, "
             "hflip: true}",
             dir);
    fuzz_data_open(&data_run, section);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *sep = memmem(data, size, SEPARATOR, sizeof SEPARATOR - 1);
    size_t images = sep ? (size_t)(sep - data) : size;
    size_t labels_at = sep ? images + sizeof SEPARATOR - 1 : size;
    fuzz_write_file(dir, "images", data, images);
    fuzz_write_file(dir, "labels", data + labels_at, size - labels_at);
    fuzz_data_cycle(&data_run);
    return 0;
}
