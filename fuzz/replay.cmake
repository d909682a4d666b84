# fuzz/replay.cmake - the fuzz targets, included from tests/CMakeLists.txt.
#
# Every target fuzz/fuzz_<name>.c builds twice:
#   fuzz_<name>_replay  (always, any compiler): replay_main.c feeds it the
#       files of fuzz/corpus/<name> and fuzz/regressions/<name>; ctest runs
#       it as fuzz_replay_<name>, so every crash once found stays fixed.
#   fuzz_<name>         (VH_FUZZ=ON, clang): linked with libFuzzer;
#       tools/fuzz.sh runs each for a bounded time.
set(VH_FUZZ_DIR ${CMAKE_SOURCE_DIR}/fuzz)
if(VH_FUZZ)
  add_custom_target(vh_fuzz)  # every libFuzzer binary and the plugins they load
endif()

#   vh_add_fuzz_target(name [SOURCES extra...] [LIBS libs...] [INCLUDES dirs...] [PLUGINS targets...])
function(vh_add_fuzz_target name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "SOURCES;LIBS;INCLUDES;PLUGINS")
  set(sources ${VH_FUZZ_DIR}/fuzz_${name}.c ${VH_FUZZ_DIR}/fuzz_util.c ${arg_SOURCES})
  set(exes fuzz_${name}_replay)
  add_executable(fuzz_${name}_replay ${sources} ${VH_FUZZ_DIR}/replay_main.c)
  if(VH_FUZZ)
    add_executable(fuzz_${name} ${sources})
    target_link_options(fuzz_${name} PRIVATE -fsanitize=fuzzer)
    target_compile_definitions(fuzz_${name} PRIVATE VH_FUZZ_LIBFUZZER)
    list(APPEND exes fuzz_${name})
    add_dependencies(vh_fuzz fuzz_${name})
    if(arg_PLUGINS)
      add_dependencies(vh_fuzz ${arg_PLUGINS})
    endif()
  endif()
  foreach(exe ${exes})
    target_include_directories(${exe} PRIVATE ${VH_FUZZ_DIR} ${arg_INCLUDES})
    target_link_libraries(${exe} PRIVATE vhhost ${arg_LIBS})
    target_compile_definitions(${exe} PRIVATE VH_FUZZ_PLUGIN_DIR="${VH_BUILD_PLUGIN_DIR}")
    if(arg_PLUGINS)
      add_dependencies(${exe} ${arg_PLUGINS})
    endif()
  endforeach()
  add_test(NAME fuzz_replay_${name}
           COMMAND fuzz_${name}_replay ${VH_FUZZ_DIR}/corpus/${name}
                   ${VH_FUZZ_DIR}/regressions/${name})
  set_tests_properties(fuzz_replay_${name} PROPERTIES ENVIRONMENT "VITHOST_PLUGIN_PATH=")
endfunction()

vh_add_fuzz_target(recipe
  PLUGINS vh_plugin_vit vh_plugin_fp32 vh_plugin_ddp vh_plugin_idx vh_test_plugins)
vh_add_fuzz_target(safetensors)
vh_add_fuzz_target(idx PLUGINS vh_plugin_idx vh_test_plugins)
vh_add_fuzz_target(cifar PLUGINS vh_plugin_cifar vh_test_plugins)
vh_add_fuzz_target(image
  SOURCES ${CMAKE_SOURCE_DIR}/plugins/data/imagefolder/decode.c
  INCLUDES ${CMAKE_SOURCE_DIR}/plugins/data/imagefolder
  LIBS JPEG::JPEG PNG::PNG)
