# fsdp and zero1 in one process: against ddp bit for bit on 1 and 3 ranks
# (threads with a fake communicator), the slices and memory of a ViT-B/16
# sized table on 1 to 4 ranks (zero1's optimizer state 1/world of ddp's),
# ZeRO-2/ZeRO-3 gather bookkeeping, misuse, state io.
find_package(Threads REQUIRED)
vh_add_test(test_fsdp test_fsdp.c)
target_link_libraries(test_fsdp PRIVATE Threads::Threads)
add_dependencies(test_fsdp vh_plugin_fsdp vh_plugin_zero1 vh_plugin_ddp vh_plugin_fp32
                 vh_test_plugins)
