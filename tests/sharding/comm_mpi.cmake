# libvh_comm_mpi.so under `mpirun -np 3`: every collective, dtype and op,
# requests in flight, test(), zero counts and refused arguments.
# (Included from tests/sharding: the sources live one folder up.)
set(VH_TESTS_DIR ${CMAKE_CURRENT_SOURCE_DIR}/..)
add_executable(test_comm_mpi ${VH_TESTS_DIR}/test_comm_mpi.c)
target_link_libraries(test_comm_mpi PRIVATE vhhost PkgConfig::CMOCKA ${CMAKE_DL_LIBS})
target_compile_definitions(test_comm_mpi PRIVATE
  VH_TEST_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
  VH_TEST_DATA_DIR="${VH_TESTS_DIR}/data"
  VH_TEST_BUILD_DIR="${CMAKE_BINARY_DIR}"
  VH_TEST_PLUGIN_DIR="${VH_BUILD_PLUGIN_DIR}"
  VH_TEST_BROKEN_DIR="${CMAKE_BINARY_DIR}/tests/broken"
  VH_TEST_VITHOST="$<TARGET_FILE:vithost>")
if(TARGET vh_comm_mpi)
  add_dependencies(test_comm_mpi vh_comm_mpi)
  vh_add_mpi_test(test_comm_mpi 3 test_comm_mpi)
  if(VH_SANITIZE)
    # OpenMPI's own allocations (ORTE, hwloc, libevent, its components) outlive
    # MPI_Finalize; LeakSanitizer reports only ours. OpenMPI has no frame
    # pointers and unloads its components, so only the slow unwinder finds the
    # OpenMPI frame a suppression can match.
    file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/comm_mpi.lsan
         "leak:libmpi.so\nleak:libopen-pal.so\nleak:libopen-rte.so\nleak:libpmix.so\n"
         "leak:libhwloc.so\nleak:libevent\nleak:mca_\n")
    set_property(TEST test_comm_mpi APPEND PROPERTY ENVIRONMENT
                 "LSAN_OPTIONS=suppressions=${CMAKE_CURRENT_BINARY_DIR}/comm_mpi.lsan:fast_unwind_on_malloc=0")
  endif()
else()
  # No MPI in this build: the test exists and reports itself skipped.
  add_test(NAME test_comm_mpi
           COMMAND sh -c "echo 'test_comm_mpi: SKIPPED: built without libvh_comm_mpi'; exit 77")
  set_tests_properties(test_comm_mpi PROPERTIES SKIP_RETURN_CODE 77)
endif()
