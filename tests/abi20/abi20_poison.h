/* abi20_poison.h - what lies right after each table the ABI 2.0 test
 * plugins hand the host (their vtables, the backend's vh_comm and ops):
 * odd values that are no pointer. A host that reads a 2.0 table past its
 * 2.0 size, instead of up to the size the plugin declared, calls or
 * dereferences one of them and fails tests/test_abi20.c at once, rather
 * than reading whatever the linker put there. */
#ifndef VITHOST_TESTS_ABI20_POISON_H
#define VITHOST_TESTS_ABI20_POISON_H

#include <stdint.h>

#define ABI20_POISON                                                                 \
    {(uintptr_t)0x51, (uintptr_t)0x53, (uintptr_t)0x55, (uintptr_t)0x57,             \
     (uintptr_t)0x59, (uintptr_t)0x5b, (uintptr_t)0x5d, (uintptr_t)0x5f}

#endif
