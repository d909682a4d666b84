/* elf_symbol.c - an exported data symbol's bytes, read from the file.
 *
 * Walks the section headers to the dynamic symbol table (.dynsym, the table
 * dlsym searches), finds the symbol, and reads its bytes at the file offset
 * of the section that holds it. Every offset and size read from the file is
 * checked against the file before it is used: the file may be anything.
 */
#define _POSIX_C_SOURCE 200809L
#include "elf_symbol.h"

#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if __ELF_NATIVE_CLASS == 64
#define NATIVE_CLASS ELFCLASS64
#define SYM_BIND ELF64_ST_BIND
#define SYM_VISIBILITY ELF64_ST_VISIBILITY
#else
#define NATIVE_CLASS ELFCLASS32
#define SYM_BIND ELF32_ST_BIND
#define SYM_VISIBILITY ELF32_ST_VISIBILITY
#endif

/* Tables larger than this are not a plugin's (and not worth reading). */
#define MAX_TABLE_BYTES ((uint64_t)64 << 20)

/* Reads [offset, offset + len) of the file; 0 when it is not all there. */
static int read_at(int fd, uint64_t file_size, uint64_t offset, void *buf, uint64_t len) {
    if (offset > file_size || len > file_size - offset) return 0;
    size_t done = 0;
    while (done < len) {
        ssize_t n = pread(fd, (char *)buf + done, (size_t)(len - done), (off_t)(offset + done));
        if (n <= 0) return 0;
        done += (size_t)n;
    }
    return 1;
}

/* A whole table of the file, malloc'd; NULL when it is not all there. */
static void *read_table(int fd, uint64_t file_size, uint64_t offset, uint64_t len) {
    if (len == 0 || len > MAX_TABLE_BYTES) return NULL;
    void *buf = malloc((size_t)len);
    if (buf && !read_at(fd, file_size, offset, buf, len)) {
        free(buf);
        buf = NULL;
    }
    return buf;
}

static int find_symbol(int fd, uint64_t file_size, const char *name, void *buf, size_t len,
                       size_t *size) {
    ElfW(Ehdr) eh;
    if (!read_at(fd, file_size, 0, &eh, sizeof eh)) return 0;
    if (memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != NATIVE_CLASS ||
        eh.e_type != ET_DYN || eh.e_shentsize != sizeof(ElfW(Shdr)) || eh.e_shnum == 0)
        return 0;
    ElfW(Shdr) *sh = read_table(fd, file_size, eh.e_shoff, (uint64_t)eh.e_shnum * sizeof *sh);
    if (!sh) return 0;
    int found = 0;
    ElfW(Sym) *syms = NULL;
    char *names = NULL;
    for (int i = 0; i < eh.e_shnum && !found; i++) {
        if (sh[i].sh_type != SHT_DYNSYM || sh[i].sh_entsize != sizeof(ElfW(Sym)) ||
            sh[i].sh_link >= eh.e_shnum)
            continue;
        const ElfW(Shdr) *strtab = &sh[sh[i].sh_link];
        syms = read_table(fd, file_size, sh[i].sh_offset, sh[i].sh_size);
        names = read_table(fd, file_size, strtab->sh_offset, strtab->sh_size);
        if (!syms || !names) break;
        size_t names_len = (size_t)strtab->sh_size, want = strlen(name);
        size_t count = (size_t)(sh[i].sh_size / sizeof(ElfW(Sym)));
        for (size_t k = 0; k < count; k++) {
            const ElfW(Sym) *s = &syms[k];
            if (s->st_name >= names_len || names_len - s->st_name <= want ||
                memcmp(names + s->st_name, name, want + 1) != 0)
                continue;
            int bind = SYM_BIND(s->st_info);
            if ((bind != STB_GLOBAL && bind != STB_WEAK) ||
                SYM_VISIBILITY(s->st_other) != STV_DEFAULT || s->st_shndx == SHN_UNDEF ||
                s->st_shndx >= eh.e_shnum)
                break;
            const ElfW(Shdr) *home = &sh[s->st_shndx];
            if (home->sh_type == SHT_NOBITS || s->st_value < home->sh_addr ||
                s->st_value - home->sh_addr > home->sh_size)
                break;
            uint64_t offset = home->sh_offset + (s->st_value - home->sh_addr);
            size_t n = s->st_size < len ? (size_t)s->st_size : len;
            found = read_at(fd, file_size, offset, buf, n);
            *size = (size_t)s->st_size;
            break;
        }
        break; /* one dynamic symbol table per file */
    }
    free(syms);
    free(names);
    free(sh);
    return found;
}

int elf_read_symbol(const char *path, const char *name, void *buf, size_t len, size_t *size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    struct stat sb;
    int found = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) &&
                find_symbol(fd, (uint64_t)sb.st_size, name, buf, len, size);
    close(fd);
    return found;
}
