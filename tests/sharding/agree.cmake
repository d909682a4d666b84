# `mpirun` end to end: ranks that run different recipes or plugins are refused
# with one message, SIGTERM and SIGUSR1 to mpirun stop with a checkpoint and
# the continue line, a recipe error exits 3 as in one process. Runs mpirun
# itself (one ctest process); without mpirun it exits 77.
add_executable(test_agree_mpi ${CMAKE_CURRENT_SOURCE_DIR}/test_agree_mpi.c)
target_link_libraries(test_agree_mpi PRIVATE vhtestharness PkgConfig::CMOCKA)
target_compile_definitions(test_agree_mpi PRIVATE
  VH_TEST_VITHOST="$<TARGET_FILE:vithost>"
  VH_TEST_MPIRUN="$<IF:$<BOOL:${MPIEXEC_EXECUTABLE}>,${MPIEXEC_EXECUTABLE},>")
add_dependencies(test_agree_mpi vithost vh_plugin_vit vh_plugin_fp32 vh_plugin_ddp vh_plugin_mta
                 vh_plugin_synthetic)
foreach(dep vh_plugin_fsdp vh_comm_mpi)
  if(TARGET ${dep})
    add_dependencies(test_agree_mpi ${dep})
  endif()
endforeach()
add_test(NAME test_agree_mpi COMMAND test_agree_mpi)
set_tests_properties(test_agree_mpi PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300
                     ENVIRONMENT "VITHOST_PLUGIN_PATH=")
if(VH_SANITIZE AND EXISTS ${CMAKE_CURRENT_BINARY_DIR}/comm_mpi.lsan)
  set_property(TEST test_agree_mpi APPEND PROPERTY ENVIRONMENT
               "LSAN_OPTIONS=suppressions=${CMAKE_CURRENT_BINARY_DIR}/comm_mpi.lsan:fast_unwind_on_malloc=0")
endif()
