/* testhost_internal.h - what the files of libvhtesthost share. */
#ifndef VH_TESTHOST_INTERNAL_H
#define VH_TESTHOST_INTERNAL_H

#include <vithost/vh_testhost.h>

/* One key of the plugin's schema and its value. */
typedef struct th_value {
    const vh_config_key *key;
    int has_value;
    int32_t source; /* vh_config_source: DEFAULT or SET */
    char *text;     /* the value as written; malloc'd */
    int64_t i;
    double f;
    int b;
} th_value;

/* An optimizer's tensor: one parameter, handed over as one slice. */
typedef struct th_tensor {
    int64_t count;
    uint32_t flags;
    float *values, *grad, *state[VH_OPTIM_MAX_STATE_SLOTS];
} th_tensor;

struct vh_testhost {
    vh_host pub; /* first: the plugin's handle is the test host */
    const vh_plugin_descriptor *desc;
    void *dl; /* dlopen handle; NULL for a linked descriptor */
    void *self;
    int created;
    uint64_t seed;
    vh_comm comm;
    th_value *values;
    int num_values;
    char error[1024];
    char *log;
    size_t log_len, log_cap;
    /* The setup create had (role's struct), for state_roundtrip. */
    union {
        vh_model_setup model;
        vh_optim_setup optim;
        vh_data_setup data;
        unsigned char raw[256];
    } setup;
    vh_precision_policy policy; /* fp32, for the default setups */
    /* optim */
    th_tensor *tensors;
    int num_tensors;
    uint32_t item_size;
    int64_t next_step; /* what a step without args takes: after the last one */
    unsigned char *items;
    vh_param_slices slices;
    vh_param_desc *params;
    char *param_names; /* "t0", "t1", ... 24 bytes each */
    vh_unit_desc unit;
    vh_param_table table;
    /* data: what the batches are held to */
    vh_data_info info;
    int64_t batch_size;
    int32_t split;
};

/* Records the message (vh_testhost_error) and returns st. */
vh_status th_fail(vh_testhost *th, vh_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
extern const vh_host_api th_host_api;

/* testhost_config.c */
vh_status th_config_init(vh_testhost *th);
void th_config_free(vh_testhost *th);
th_value *th_config_find(const vh_testhost *th, const char *key);
vh_status th_config_check_required(vh_testhost *th);

/* testhost_optim.c */
void th_optim_free(vh_testhost *th);
/* The default setup's parameter table, of the tensors added so far. */
vh_status th_optim_table(vh_testhost *th);

#endif
