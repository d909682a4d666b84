# The NCCL backend's id exchange (sdk/comm_nccl/comm_nccl_id.c: plain C over
# MPI) under `mpirun -np 2`: every rank ends with the root's bytes. Needs MPI
# only, so it runs on machines without a GPU or NCCL.
if(TARGET MPI::MPI_C)
  add_executable(test_nccl_id_mpi ${CMAKE_CURRENT_SOURCE_DIR}/test_nccl_id_mpi.c
                 ${CMAKE_SOURCE_DIR}/sdk/comm_nccl/comm_nccl_id.c)
  target_include_directories(test_nccl_id_mpi PRIVATE ${CMAKE_SOURCE_DIR}/sdk/comm_nccl)
  target_link_libraries(test_nccl_id_mpi PRIVATE MPI::MPI_C PkgConfig::CMOCKA)
  vh_add_mpi_test(test_nccl_id_mpi 2 test_nccl_id_mpi)
  if(VH_SANITIZE AND EXISTS ${CMAKE_CURRENT_BINARY_DIR}/comm_mpi.lsan)
    set_property(TEST test_nccl_id_mpi APPEND PROPERTY ENVIRONMENT
                 "LSAN_OPTIONS=suppressions=${CMAKE_CURRENT_BINARY_DIR}/comm_mpi.lsan:fast_unwind_on_malloc=0")
  endif()
else()
  add_test(NAME test_nccl_id_mpi
           COMMAND sh -c "echo 'test_nccl_id_mpi: SKIPPED: built without MPI'; exit 77")
  set_tests_properties(test_nccl_id_mpi PROPERTIES SKIP_RETURN_CODE 77)
endif()
