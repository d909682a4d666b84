# The SDK for out-of-tree plugins (included from tests/CMakeLists.txt):
# test_sdk_install installs this build into a temporary prefix, builds
# examples/ and a fresh `vithost new-plugin` project of every role against
# that prefix alone (the optim project and examples/ without a build type:
# Release flags, -std=c11 and libm asserted; the optim project's unit test run
# by ctest in the test host), checks pkg-config, and trains 3 steps of the main job
# with each plugin, loaded by name through VITHOST_PLUGIN_PATH by the
# INSTALLED vithost.
vh_add_test(test_sdk_install test_sdk_install.c)
# A sanitized build installs an instrumented SDK: the plain programs the test
# compiles against it (pkg-config, new-plugin unit tests) load libasan late.
if(VH_SANITIZE)
  target_compile_definitions(test_sdk_install PRIVATE VH_TEST_SANITIZED=1)
endif()
target_compile_definitions(test_sdk_install PRIVATE
  VH_TEST_CMAKE="${CMAKE_COMMAND}"
  VH_TEST_CTEST="${CMAKE_CTEST_COMMAND}"
  VH_TEST_CC="${CMAKE_C_COMPILER}"
  VH_TEST_EXAMPLES_DIR="${CMAKE_SOURCE_DIR}/examples"
  VH_TEST_MAIN_DATA="/usr/share/datasets/fashion-mnist")
# Everything `cmake --install` copies must be built first.
add_dependencies(test_sdk_install vithost vh_plugin_vit vh_plugin_fp32 vh_plugin_ddp vh_plugin_mta
                 vh_plugin_idx vh_plugin_synthetic vhtesthost)
# cmake configures and compiles seven small projects: tens of seconds.
set_tests_properties(test_sdk_install PROPERTIES TIMEOUT 900 SKIP_RETURN_CODE 77)
