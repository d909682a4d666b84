/* elf_symbol.h - reading an exported data symbol from a shared object file
 * without loading it.
 *
 * dlopen runs a library's constructors, so a plugin of another ABI version
 * would run code before the host could refuse it. The loader first reads the
 * plugin descriptor's fixed header straight from the file with this, and
 * loads the file only when the header says the versions agree.
 */
#ifndef VITHOST_HOST_ELF_SYMBOL_H
#define VITHOST_HOST_ELF_SYMBOL_H

#include <stddef.h>

/* Copies the first min(len, symbol size) bytes of the exported (global or
 * weak, default visibility, defined) symbol `name` of the ELF file at path
 * into buf and sets *size to the symbol's size. Returns 1 on success; 0 when
 * the file is not a native ELF shared object with section headers, does not
 * export the symbol, or the symbol has no bytes in the file (the caller then
 * lets dlopen and dlsym say what is wrong). */
int elf_read_symbol(const char *path, const char *name, void *buf, size_t len, size_t *size);

#endif
