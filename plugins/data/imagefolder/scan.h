/* scan.h - the class folders of an image-folder data set, as torchvision's
 * ImageFolder reads them.
 *
 *     <train_dir>/<class>/<image>    labels: class folders sorted by name (bytes)
 *     <eval_dir>/<class>/<image>     the train classes and labels
 *
 * Images are the files directly in a class folder whose names end in .jpg,
 * .jpeg or .png (any case), sorted by name; names starting with '.' are
 * skipped, as are other files (counted) and sub-folders (not searched).
 * Symbolic links are followed. A class folder without images is an error
 * naming it; so is an eval class that training does not have. An eval split
 * may lack classes.
 */
#ifndef IMAGEFOLDER_SCAN_H
#define IMAGEFOLDER_SCAN_H

#include <stdint.h>

#include "vithost/vh_host.h"

/* Growable text: NUL-separated strings addressed by offset. */
typedef struct imf_pool {
    char *text;
    size_t len, cap;
} imf_pool;

typedef struct imf_classes {
    imf_pool names;
    int64_t *name_at; /* offset of class i's name in names */
    int32_t count;
} imf_classes;

/* The images of one split: sample i is <dir>/<pool + path_at[i]>, label[i]. */
typedef struct imf_split {
    char *dir; /* host-allocated copy */
    imf_pool paths;
    int64_t *path_at;
    int32_t *label;
    int64_t count, cap;
    int64_t skipped; /* files with other extensions */
} imf_split;

const char *imf_class_name(const imf_classes *c, int32_t i);
void imf_classes_free(vh_host *host, imf_classes *c);
void imf_split_free(vh_host *host, imf_split *s);

/* The class folders of dir, sorted. Fails (naming dir) when it cannot be
 * opened or has none; *missing is set to 1 when dir does not exist. */
vh_status imf_scan_classes(vh_host *host, const char *dir, imf_classes *out, int *missing);

/* The images of dir, labelled by `classes`. */
vh_status imf_scan_split(vh_host *host, const char *dir, const imf_classes *classes,
                         imf_split *out);

#endif
