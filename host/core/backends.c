/* backends.c - the run's device (run.device) and communicator (run.comm).
 *
 * The CPU device and the one-process communicator are built into the SDK.
 * The others live in their own shared objects, loaded only when a recipe
 * asks for them, so a build without CUDA or MPI still runs everything else:
 * libvh_cuda.so, libvh_comm_mpi.so, libvh_comm_nccl.so, in <exe dir>/lib in
 * the build tree and in the libdir once installed (found relative to the
 * executable first, so an installed tree works wherever it is copied).
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agree.h"
#include "exit_codes.h"
#include "runtime.h"
#include "vithost/vh_cuda_ext.h"
#include "vithost/vh_runtime.h"

/* dlopen of the first `file` found where backends live. *found: whether a
 * file exists at all (loaded or not); why: dlerror of the last failure. */
static void *open_backend_lib(const char *file, int *found, char *why, size_t why_len) {
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    char candidates[3][4200];
    int count = 0;
    if (n > 0) {
        exe[n] = '\0';
        const char *dir = dirname(exe);
        snprintf(candidates[count++], sizeof candidates[0], "%s/lib/%s", dir, file);
#ifdef VH_LIB_DIR_FROM_EXE
        snprintf(candidates[count++], sizeof candidates[0], "%s/%s/%s", dir, VH_LIB_DIR_FROM_EXE,
                 file);
#endif
    }
#ifdef VH_INSTALL_LIB_DIR
    snprintf(candidates[count++], sizeof candidates[0], "%s/%s", VH_INSTALL_LIB_DIR, file);
#endif
    *found = 0;
    why[0] = '\0';
    for (int i = 0; i < count; i++) {
        if (access(candidates[i], F_OK) != 0) continue;
        *found = 1;
        void *lib = dlopen(candidates[i], RTLD_NOW | RTLD_LOCAL);
        if (lib) return lib;
        snprintf(why, why_len, "%s", dlerror());
    }
    return NULL;
}

/* ---- what the launcher says ------------------------------------------------ */

/* The first of these variables that holds a number >= 0; -1 when none. */
static long env_number(const char *const *names) {
    for (int i = 0; names[i]; i++) {
        const char *v = getenv(names[i]);
        if (!v || !*v) continue;
        char *end;
        long n = strtol(v, &end, 10);
        if (*end == '\0' && n >= 0) return n;
    }
    return -1;
}

/* OpenMPI, MPICH/Hydra (PMI), Slurm's srun, and torchrun-style launchers.
 * Slurm: the job step's count, which srun gives its tasks; SLURM_NTASKS is
 * also set in an sbatch script or salloc shell, where vithost is one process
 * (tests/slurm/test_srun.sh). */
int32_t run_launcher_world_size(void) {
    static const char *const names[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE",
                                        "SLURM_STEP_NUM_TASKS", "WORLD_SIZE", NULL};
    long n = env_number(names);
    return n >= 1 && n < 1000000 ? (int32_t)n : 1;
}

const char *run_launcher_command(void) {
    if (getenv("OMPI_COMM_WORLD_SIZE")) return "mpirun -np";
    if (getenv("SLURM_STEP_NUM_TASKS")) {
        /* with the PMI it was started with: a cluster's default may be none */
        static char srun[64];
        const char *mpi = getenv("SLURM_MPI_TYPE");
        if (!mpi || !*mpi || strcmp(mpi, "none") == 0 || strlen(mpi) > 32) return "srun -n";
        snprintf(srun, sizeof srun, "srun --mpi=%s -n", mpi);
        return srun;
    }
    return getenv("PMI_SIZE") ? "mpiexec -n" : "mpirun -np";
}

/* srun without a PMI (--mpi=none, a cluster's usual MpiDefault) starts N
 * processes that MPI_Init cannot join: each would end in OpenMPI's page
 * about its build instead of a line on what to type. */
static int srun_without_pmi(void) {
    return getenv("SLURM_STEP_NUM_TASKS") && !getenv("OMPI_COMM_WORLD_SIZE") &&
           !getenv("PMIX_RANK") && !getenv("PMI_RANK") && !getenv("PMI_FD");
}

int32_t run_launcher_local_rank(void) {
    static const char *const names[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                        "SLURM_LOCALID", "LOCAL_RANK", NULL};
    long n = env_number(names);
    return n >= 0 && n < 1000000 ? (int32_t)n : 0;
}

/* The GPU of a rank: its place among the ranks of its machine, modulo the
 * GPUs this process sees (more ranks than GPUs share them round-robin). The
 * count comes from the CUDA runtime that libvh_cuda.so loaded, so the host
 * links no CUDA; when it cannot be read (no driver, no GPU) the local rank
 * is passed as it is and the library's open says what is missing. */
static int32_t cuda_ordinal(void *cuda_lib, int32_t local_rank) {
    int (*device_count)(int *);
    *(void **)&device_count = dlsym(cuda_lib, "cudaGetDeviceCount");
    int count = 0;
    if (!device_count || device_count(&count) != 0 || count <= 0) return local_rank;
    return local_rank % count;
}

int64_t run_device_peak_bytes(const vh_run *run) {
    const vh_device_ops *dev = run->device;
    if (!dev || dev->kind == VH_DEVICE_KIND_CPU || !dev->get_extension) return -1;
    const vh_cuda_memory *mem = dev->get_extension(dev->device, VH_CUDA_MEMORY_EXTENSION);
    vh_cuda_memory_info info = {.struct_size = sizeof info};
    if (!mem || !VH_STRUCT_HAS(mem, vh_cuda_memory, read) || !mem->read ||
        mem->read(dev->device, &info) != VH_STATUS_OK ||
        !VH_STRUCT_HAS(&info, vh_cuda_memory_info, peak_bytes))
        return -1;
    return (int64_t)info.peak_bytes;
}

vh_status run_open_device(vh_run *run, vh_diag *d) {
    const char *device = run_config_string(run, "device");
    if (strcmp(device, "cpu") == 0) {
        run->device = vh_cpu_device_ops();
        return VH_STATUS_OK;
    }
    char why[1024];
    int found;
    run->cuda_lib = open_backend_lib("libvh_cuda.so", &found, why, sizeof why);
    if (!run->cuda_lib && !found)
        snprintf(why, sizeof why, "libvh_cuda.so is not installed (this vithost was built "
                                  "without the CUDA toolkit)");
    if (!run->cuda_lib)
        return diag_set(d, VH_STATUS_ERR_DEVICE,
                        "run.device is cuda, but the CUDA device library cannot be loaded: %s "
                        "(use `--set run.device=cpu` to train on the CPU)",
                        why);
    vh_cuda_device_open_fn open_fn;
    *(void **)&open_fn = dlsym(run->cuda_lib, VH_CUDA_OPEN_SYMBOL);
    if (!open_fn)
        return diag_set(d, VH_STATUS_ERR_DEVICE, "libvh_cuda.so lacks %s: rebuild vithost",
                        VH_CUDA_OPEN_SYMBOL);
    /* The device opens before the communicator (NCCL needs it), so the
     * launcher's environment says which GPU is this rank's. */
    vh_cuda_open_args args = {.struct_size = sizeof args, .abi_major = VH_ABI_MAJOR,
                              .abi_minor = VH_ABI_MINOR,
                              .ordinal = cuda_ordinal(run->cuda_lib, run_launcher_local_rank())};
    vh_status st = open_fn(&args, &run->cuda_ops, sizeof run->cuda_ops, why, sizeof why);
    if (st != VH_STATUS_OK)
        return diag_set(d, st, "run.device is cuda: %s (use `--set run.device=cpu`)", why);
    run->device = &run->cuda_ops;
    return VH_STATUS_OK;
}

/* "MPI", "NCCL": how the message names a backend. */
static void upper(char *out, size_t len, const char *name) {
    size_t i = 0;
    for (; name[i] && i + 1 < len; i++)
        out[i] = (char)(name[i] >= 'a' && name[i] <= 'z' ? name[i] - 'a' + 'A' : name[i]);
    out[i] = '\0';
}

vh_status run_open_comm(vh_run *run, vh_diag *d) {
    const char *name = run_config_string(run, "comm");
    int32_t launched = run_launcher_world_size();
    /* auto: the launcher decides. Without this, `mpirun -np 4 vithost run`
     * with a self communicator would train four unrelated copies into one
     * run folder. */
    if (strcmp(name, "auto") == 0) name = launched > 1 ? "mpi" : "self";
    else if (strcmp(name, "self") == 0 && launched > 1)
        return diag_set(d, VH_STATUS_ERR_CONFIG,
                        "%s: run.comm is self, but this process is one of %d started by a "
                        "launcher (mpirun or srun); use run.comm: mpi (or auto), or start one "
                        "process",
                        run->recipe.file, (int)launched);
    /* self: run_open already installed the one-process communicator (and a
     * test may have put its own in its place). */
    if (strcmp(name, "self") == 0) {
        /* On a GPU its copies must go through the device (memmove would
         * read device memory from the host). A test's own communicator stays. */
        if (run->comm.ops && run->comm.backend && strcmp(run->comm.backend, "self") == 0 &&
            !run->comm.impl)
            vh_comm_self_init_device(&run->comm, run->device);
        return VH_STATUS_OK;
    }
    if (strcmp(name, "mpi") == 0 && launched > 1 && srun_without_pmi()) {
        const char *pmi = getenv("SLURM_MPI_TYPE");
        return diag_set(d, VH_STATUS_ERR_COMM,
                        "run.comm is mpi under srun, but srun gave these %d processes no PMI "
                        "(--mpi=%s), so MPI cannot join them: start them with `srun "
                        "--mpi=pmix -n %d vithost run ...` (`srun --mpi=list` lists what the "
                        "cluster has)",
                        (int)launched, pmi && *pmi ? pmi : "none", (int)launched);
    }
    char file[64], label[16], why[1024];
    snprintf(file, sizeof file, "libvh_comm_%s.so", name);
    upper(label, sizeof label, name);
    int found;
    run->comm_lib = open_backend_lib(file, &found, why, sizeof why);
    if (!run->comm_lib && !found)
        return diag_set(d, VH_STATUS_ERR_COMM,
                        "run.comm is %s%s, but this vithost has no %s backend (%s not found); "
                        "use run.comm: self and one process, or rebuild with %s",
                        name, launched > 1 ? " (started by a launcher)" : "", label, file,
                        strcmp(name, "mpi") == 0 ? "OpenMPI (apt-get install libopenmpi-dev)"
                                                 : "the CUDA toolkit and NCCL");
    if (!run->comm_lib)
        return diag_set(d, VH_STATUS_ERR_COMM,
                        "run.comm is %s, but %s cannot be loaded: %s (install the %s library "
                        "it needs, or use run.comm: self)",
                        name, file, why, label);
    vh_comm_open_fn open_fn;
    *(void **)&open_fn = dlsym(run->comm_lib, VH_COMM_OPEN_SYMBOL);
    *(void **)&run->comm_close = dlsym(run->comm_lib, VH_COMM_CLOSE_SYMBOL);
    if (!open_fn || !run->comm_close)
        return diag_set(d, VH_STATUS_ERR_COMM, "%s lacks %s or %s: rebuild vithost", file,
                        VH_COMM_OPEN_SYMBOL, VH_COMM_CLOSE_SYMBOL);
    vh_comm_open_args args = {.struct_size = sizeof args, .abi_major = VH_ABI_MAJOR,
                              .abi_minor = VH_ABI_MINOR, .device = run->device};
    vh_status st = open_fn(&args, &run->comm_opened, why, sizeof why);
    if (st != VH_STATUS_OK)
        return diag_set(d, st,
                        "run.comm is %s: %s (use run.comm: self for one process)", name, why);
    if (!run->comm_opened || !run->comm_opened->ops)
        return diag_set(d, VH_STATUS_ERR_COMM, "%s opened no communicator: rebuild vithost",
                        file);
    /* Never a copy by value: a backend of an older minor has a smaller
     * vh_comm and vh_comm_ops, read up to their struct_size. */
    st = comm_upgrade(&run->comm, &run->comm_stats.inner_ops, run->comm_opened, why,
                      sizeof why);
    if (st != VH_STATUS_OK) return diag_set(d, st, "run.comm is %s: %s: rebuild it", name, why);
    return VH_STATUS_OK;
}

vh_status run_open_backends(vh_run *run, vh_diag *d) {
    if (run->backends_open) return VH_STATUS_OK;
    vh_status st = run_open_device(run, d);
    if (st == VH_STATUS_OK) st = run_open_comm(run, d);
    if (st != VH_STATUS_OK) return st;
    comm_stats_install(&run->comm, &run->comm_stats);
    run->backends_open = 1;
    /* before any plugin is created: a rank with another model or sharding
     * would otherwise fail inside the first collectives, with MPI's words */
    st = agree_check(run, d);
    /* (a mismatch ends every rank by itself; a rank that could not take
     * part in the exchange would leave the others waiting in it) */
    if (st != VH_STATUS_OK) run_fail_all_ranks(run, st, d->text);
    return st;
}

void run_fail_all_ranks(vh_run *run, vh_status st, const char *text) {
    if (st == VH_STATUS_OK || st == VH_STATUS_ERR_INTERRUPTED || !run->backends_open ||
        run->comm.world_size <= 1 || run->failed_together)
        return;
    fprintf(stderr, "vithost: rank %d of %d: %s\n", (int)run->comm.rank,
            (int)run->comm.world_size, text);
    fflush(stderr);
    fflush(stdout);
    /* the launcher's exit code is the abort's: the one a single process
     * exits with (command_exit_code) */
    run->comm.ops->abort(&run->comm,
                         st == VH_STATUS_ERR_CONFIG ? VH_EXIT_RECIPE : VH_EXIT_RUN_FAILED);
}

void run_close_backends(vh_run *run) {
    if (run->comm_opened && run->comm_close) run->comm_close(run->comm_opened);
    run->backends_open = 0;
    run->comm_opened = NULL;
    if (run->comm_lib) dlclose(run->comm_lib);
    run->comm_lib = NULL;
    if (run->cuda_lib) dlclose(run->cuda_lib);
    run->cuda_lib = NULL;
}
