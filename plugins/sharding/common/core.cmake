# The sharding core (sharding_core.h), compiled into each sharding plugin;
# it is not part of the SDK. A plugin's CMakeLists includes this file and
# adds ${VH_SHARDING_CORE} to its sources.
set(VH_SHARDING_CORE
    ${CMAKE_CURRENT_LIST_DIR}/core.c
    ${CMAKE_CURRENT_LIST_DIR}/shards.c
    ${CMAKE_CURRENT_LIST_DIR}/replica.c
    ${CMAKE_CURRENT_LIST_DIR}/sharding_checks.c)
