# ddp for many processes, in one process: gradient buckets (bucket_mb), the
# broadcast from rank 0 in load_unit and progress (test) between units, with a
# fake second rank that records every collective.
vh_add_test(test_ddp_buckets ${CMAKE_CURRENT_LIST_DIR}/test_ddp_buckets.c)
add_dependencies(test_ddp_buckets vh_plugin_ddp vh_test_plugins)
target_link_libraries(test_ddp_buckets PRIVATE m)
