/* runtime.h - one run: the recipe, its resolved sections, the five loaded
 * plugins, the device and the communicator.
 *
 * run_open does everything `vithost check` promises (read the recipe, apply
 * --set, check the run section against the host's schema, load each role's
 * plugin, check its section against the plugin's schema) and nothing that
 * trains. `vithost run` then hands the opened run to train_loop.c, which
 * opens the device and the communicator (backends.c) when it starts.
 */
#ifndef VITHOST_HOST_RUNTIME_H
#define VITHOST_HOST_RUNTIME_H

#include <stdio.h>

#include "comm_stats.h"
#include "vtables.h"
#include "config.h"
#include "diag.h"
#include "loader.h"
#include "recipe.h"
#include "vithost/vithost.h"

typedef struct vh_run vh_run;

/* A plugin instance's vh_host: the public part first, then the host's own. */
typedef struct vh_host_impl {
    vh_host pub;
    vh_run *run;
    vh_role role;
    const vh_section_config *config;
    char error[VH_DIAG_CAPACITY]; /* message of the last fail() */
} vh_host_impl;

typedef struct vh_run_options {
    const char *recipe_path;
    const char *const *sets; /* "section.key=value" */
    int num_sets;
    const char *out_dir;     /* NULL: no run folder */
    int trace;               /* print every plugin call */
    FILE *out;               /* progress and trace lines */
} vh_run_options;

struct vh_run {
    vh_run_options opts;
    vh_recipe recipe;
    vh_section_config run_config; /* the host's own `run` section */
    vh_plugin_path path;
    vh_plugin plugins[VH_HOST_ROLE_COUNT];
    vh_section_config configs[VH_HOST_ROLE_COUNT];
    vh_host_impl hosts[VH_HOST_ROLE_COUNT];
    const vh_device_ops *device;
    vh_device_ops cuda_ops;  /* filled when run.device is cuda */
    void *cuda_lib;          /* dlopen handle of libvh_cuda.so */
    /* The communicator plugins see (host_api comm()): the one-process one
     * until run_open_comm opens run.comm's backend, whose vh_comm is then
     * copied here (a backend keeps its state behind `impl`; tests may put
     * their own ops here after run_open). */
    vh_comm comm;
    vh_comm *comm_opened;    /* the backend's own object, for its close */
    void *comm_lib;          /* dlopen handle of libvh_comm_<name>.so */
    vh_comm_close_fn comm_close;
    vh_comm_stats comm_stats; /* the counting layer over comm (comm_stats.h) */
    int backends_open;       /* run_open_backends succeeded */
    /* Every rank failed the same way and knows it (agree.c): no abort, and
     * of many ranks rank 0 alone prints the message. */
    int failed_together;
    int load_failed;         /* run_open failed while loading a plugin */
};

/* The schema of the `run` section, owned by the host. */
extern const vh_config_key vh_run_schema[];

vh_status run_open(vh_run *run, const vh_run_options *opts, vh_diag *d);
/* The same from recipe text (tests, tools); name stands for the file. */
vh_status run_open_text(vh_run *run, const char *name, const char *text,
                        const vh_run_options *opts, vh_diag *d);
void run_close(vh_run *run);

/* ---- backends.c ---- */
/* Opens run.device: the CPU table, or libvh_cuda.so for cuda. */
vh_status run_open_device(vh_run *run, vh_diag *d);
/* Peak bytes of device memory the device's allocator has handed out since
 * it opened (libvh_cuda's "vh.cuda.memory" extension), or -1 where the device
 * does not say (the CPU: its memory is the host's, peak_mem_bytes). */
int64_t run_device_peak_bytes(const vh_run *run);
/* Opens run.comm after the device: self is built in; mpi and nccl come from
 * libvh_comm_<name>.so next to the executable (<exe dir>/lib) or in the
 * install libdir. A missing backend is VH_STATUS_ERR_COMM with one message
 * saying so and what to use instead. */
vh_status run_open_comm(vh_run *run, vh_diag *d);
/* The launcher's processes: how many ranks the environment says this
 * process is one of (mpirun, srun; 1 when none), and this one's place on
 * its machine (0 when none says), which picks its GPU before any
 * communicator exists. */
int32_t run_launcher_world_size(void);
int32_t run_launcher_local_rank(void);
/* How the launcher that started this process starts N of them, for the
 * command that continues a stopped run: "mpirun -np", "srun -n" or
 * "mpiexec -n" (then N). */
const char *run_launcher_command(void);
/* The device, then the communicator, then the counting layer over it, once
 * per run; what `run` and `eval` call before they open a session. With many
 * ranks they then check that every rank runs the same thing (agree.h). */
vh_status run_open_backends(vh_run *run, vh_diag *d);
/* A failure on one rank of many (st not OK and not INTERRUPTED, with the
 * communicator open, not failed_together): prints "vithost: rank R of N:
 * <text>" and ends every rank through the communicator's abort, so no rank
 * waits forever in a collective the failed one will never start; the
 * launcher then ends every process with the exit code one process would
 * have (3 for a recipe error, else 1). Does not return then; otherwise does
 * nothing (one process says its error as usual). */
void run_fail_all_ranks(vh_run *run, vh_status st, const char *text);
/* Closes what the two opened (run_close calls it). */
void run_close_backends(vh_run *run);

/* Prints the resolved recipe as YAML, each value commented with its origin. */
void run_print_resolved(const vh_run *run, FILE *out);

/* Typed reads of the run section (the schema guarantees the keys). */
int64_t run_config_int(const vh_run *run, const char *key);
const char *run_config_string(const vh_run *run, const char *key);

/* The host API table given to every plugin instance. */
extern const vh_host_api vh_host_api_table;
void host_impl_init(vh_host_impl *h, vh_run *run, vh_role role,
                    const vh_section_config *config);

#endif
