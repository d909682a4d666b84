# `mpirun -np N vithost run` against one process: ddp, zero1 and fsdp (ZeRO-2
# and ZeRO-3) on 2 and 3 ranks, resume on another world size, bytes per step,
# a failing and a killed rank. Runs mpirun itself (one ctest process), so it
# is added with add_test, not vh_add_mpi_test; without mpirun it exits 77.
add_executable(test_sharding_mpi ${CMAKE_CURRENT_SOURCE_DIR}/test_sharding_mpi.c)
target_link_libraries(test_sharding_mpi PRIVATE vhhost vhtestharness PkgConfig::CMOCKA m)
target_include_directories(test_sharding_mpi PRIVATE ${CMAKE_SOURCE_DIR}/host)
if(MPIEXEC_EXECUTABLE)
  set(vh_mpirun_path "${MPIEXEC_EXECUTABLE}")
else()
  set(vh_mpirun_path "")
endif()
target_compile_definitions(test_sharding_mpi PRIVATE
  VH_TEST_VITHOST="$<TARGET_FILE:vithost>"
  VH_TEST_MPIRUN="${vh_mpirun_path}")
add_dependencies(test_sharding_mpi vithost vh_plugin_vit vh_plugin_fp32 vh_plugin_ddp
                 vh_plugin_mta vh_plugin_synthetic)
foreach(sharding vh_plugin_fsdp vh_plugin_zero1)
  if(TARGET ${sharding})
    add_dependencies(test_sharding_mpi ${sharding})
  endif()
endforeach()
if(TARGET vh_comm_mpi)
  add_dependencies(test_sharding_mpi vh_comm_mpi)
endif()
add_test(NAME test_sharding_mpi COMMAND test_sharding_mpi)
set_tests_properties(test_sharding_mpi PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 900
                     ENVIRONMENT "VITHOST_PLUGIN_PATH=")
if(VH_SANITIZE AND EXISTS ${CMAKE_CURRENT_BINARY_DIR}/comm_mpi.lsan)
  # vithost under mpirun: OpenMPI's own leaks are not ours (see comm_mpi.cmake).
  set_property(TEST test_sharding_mpi APPEND PROPERTY ENVIRONMENT
               "LSAN_OPTIONS=suppressions=${CMAKE_CURRENT_BINARY_DIR}/comm_mpi.lsan:fast_unwind_on_malloc=0")
endif()
