/* test_host_pages.c - the CPU device's memory (src/cpu/pages.c): buffers of
 * 2 MiB and up are 2 MiB aligned and advised as huge-page memory, which
 * Linux shows as the "hg" flag of their mapping in /proc/self/smaps;
 * smaller ones are only aligned. Run twice by ctest: as is, and with
 * VITHOST_CPU_HUGEPAGES=0, where no buffer may be advised. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "vithost/vh_runtime.h"

#define MIB ((size_t)1 << 20)

/* 1 if the mapping holding p has the flag (two letters) in its VmFlags, 0
 * if not, -1 if /proc/self/smaps does not say. */
static int mapping_has_flag(const void *p, const char *flag) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[512];
    int in = 0, found = -1;
    const uintptr_t a = (uintptr_t)p;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            in = a >= lo && a < hi;
            continue;
        }
        if (in && strncmp(line, "VmFlags:", 8) == 0) {
            found = 0;
            for (char *t = strtok(line + 8, " \n"); t; t = strtok(NULL, " \n"))
                if (strcmp(t, flag) == 0) found = 1;
            break;
        }
    }
    fclose(f);
    return found;
}

static int advice_expected(void) {
    const char *v = getenv("VITHOST_CPU_HUGEPAGES");
    return !(v && strcmp(v, "0") == 0);
}

static void test_small_buffer_aligned(void **state) {
    (void)state;
    const vh_device_ops *d = vh_cpu_device_ops();
    void *p = NULL;
    assert_int_equal(d->alloc(d->device, 1000, &p), VH_STATUS_OK);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % 64, 0);
    memset(p, 0x5a, 1000);
    d->free(d->device, p);
}

static void test_large_buffer_advised(void **state) {
    (void)state;
    if (access("/sys/kernel/mm/transparent_hugepage/enabled", R_OK) != 0) {
        print_message("SKIPPED: this kernel has no transparent huge pages\n");
        skip();
    }
    const vh_device_ops *d = vh_cpu_device_ops();
    const size_t bytes = 5 * MIB + 3; /* not a whole number of huge pages */
    unsigned char *p = NULL;
    assert_int_equal(d->alloc(d->device, bytes, (void **)&p), VH_STATUS_OK);
    assert_non_null(p);
    memset(p, 0xa5, bytes); /* every byte asked for is there */
    assert_int_equal(p[bytes - 1], 0xa5);
    const int hg = mapping_has_flag(p, "hg"), hg_end = mapping_has_flag(p + bytes - 1, "hg");
    if (hg < 0) {
        d->free(d->device, p);
        print_message("SKIPPED: /proc/self/smaps shows no VmFlags\n");
        skip();
    }
    if (advice_expected()) {
        assert_int_equal((uintptr_t)p % (2 * MIB), 0);
        assert_int_equal(hg, 1);
        assert_int_equal(hg_end, 1);
    } else {
        assert_int_equal((uintptr_t)p % 64, 0);
        assert_int_equal(hg, 0);
    }
    d->free(d->device, p);
    /* just under the threshold: never advised */
    void *q = NULL;
    assert_int_equal(d->alloc(d->device, 2 * MIB - 64, &q), VH_STATUS_OK);
    assert_int_equal(mapping_has_flag(q, "hg"), 0);
    d->free(d->device, q);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_buffer_aligned),
        cmocka_unit_test(test_large_buffer_advised),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
