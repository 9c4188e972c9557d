#!/usr/bin/env python3
"""tests/gpu/same_code.py BEFORE AFTER — the machine code of two builds'
objects compared function by function (no GPU needed): proof that a change
meant as a pure move (a file split, a function moved) changed no code.

BEFORE and AFTER are folders of objects (a copy of build/kernels taken
before the change, and build/kernels after it); every *.o below them is read.

  device  every sm_XX cubin in the objects' fatbins (zstd-compressed entries
          too), each __global__ kernel by name: its machine code (the bytes
          of .text.<kernel>, what cuobjdump -sass disassembles), relocations
          (by symbol name), registers, .nv.info attributes, shared and
          constant bank sizes; and its PTX (.entry, the JIT path for newer
          GPUs) without the .loc / .file line directives of -lineinfo.
  host    every function objdump -dr --no-show-raw-insn shows, by name
          (qualified by object where two objects define one name):
          addresses, offsets into literal pools (.rodata+0x..) and the
          numbers of local labels (.LC3) dropped, and the padding after
          the last instruction.

nvcc 13.0 does not always give the same code for a kernel from one build to
the next of the same source (a few of the Q8_0 matrix-vector instantiations
of matmul.cu and fused.cu): --also DIR (repeatable) names another build of
BEFORE's source. A kernel whose code differs between those builds varies
by itself: when it differs in AFTER too it is counted apart ("varies
between builds of before"), not as a difference; one that matches any of
those builds counts as identical.

One line per difference, then the counts. --ignore-linkage: a PTX entry's
.visible is not compared (nvcc drops it when a kernel is made static; the
kernel keeps its name and its machine code). Exit status 0 when nothing differs and no
kernel or function is missing on either side (the host counts are reported;
--host-strict makes host differences fail too).
Needs binutils (objdump, objcopy), zstd and python3; cuobjdump is not used.
"""
import os
import re
import struct
import subprocess
import sys
import tempfile


def objects(root):
    out = []
    for d, _, fs in os.walk(root):
        out += [os.path.join(d, f) for f in fs if f.endswith('.o')]
    return sorted(out)


def section(obj, name, tmp):
    """The bytes of an ELF section of a host object (b'' when absent)."""
    path = os.path.join(tmp, 'sec')
    if os.path.exists(path):
        os.unlink(path)
    subprocess.run(['objcopy', '-O', 'binary', '--only-section=' + name, obj, path],
                   check=True, capture_output=True)
    return open(path, 'rb').read() if os.path.exists(path) else b''


def unzstd(data):
    return subprocess.run(['zstd', '-d', '-q', '-c'], input=data, check=True,
                          capture_output=True).stdout


def fatbin_entries(blob):
    """(kind, sm, payload) of each entry: kind 1 PTX, 2 ELF (cubin)."""
    off = 0
    while off + 16 <= len(blob):
        magic, _, hsize, fsize = struct.unpack_from('<IHHQ', blob, off)
        if magic != 0xBA55ED50:
            break
        p, end = off + hsize, off + hsize + fsize
        while p < end:
            kind, _, ehs, padded = struct.unpack_from('<HHIQ', blob, p)
            csize, = struct.unpack_from('<I', blob, p + 16)   # 0: not compressed
            sm, = struct.unpack_from('<I', blob, p + 28)
            data = blob[p + ehs:p + ehs + padded]
            if csize and data[:4] == b'\x28\xb5\x2f\xfd':
                data = unzstd(data[:csize])
            if kind == 1:
                data = data.rstrip(b'\0')
            yield kind, sm, data
            p += ehs + padded
        off = end


def elf_sections(elf):
    shoff = struct.unpack_from('<Q', elf, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from('<HHH', elf, 0x3A)
    secs = []
    for i in range(shnum):
        secs.append(struct.unpack_from('<IIQQQQIIQQ', elf, shoff + i * shentsize))
    strtab = secs[shstrndx]
    names = elf[strtab[4]:strtab[4] + strtab[5]]

    def nm(o):
        return names[o:names.index(b'\0', o)].decode()
    return [(nm(s[0]),) + s[1:] for s in secs]


def elf_symbols(elf, secs):
    for name, typ, _, _, off, size, link, _, _, ent in secs:
        if typ == 2:  # SHT_SYMTAB
            st = secs[link]
            strs = elf[st[4]:st[4] + st[5]]
            syms = []
            for i in range(size // ent):
                n = struct.unpack_from('<I', elf, off + i * ent)[0]
                syms.append(strs[n:strs.index(b'\0', n)].decode())
            return syms
    return []


def cubin_kernels(elf):
    """name -> a tuple of everything compared for that kernel."""
    secs = elf_sections(elf)
    syms = elf_symbols(elf, secs)
    by = {s[0]: s for s in secs}

    def body(name):
        s = by.get(name)
        if not s:
            return None
        return s[5] if s[1] == 8 else elf[s[4]:s[4] + s[5]]  # NOBITS: its size

    def relocs(name):
        s = by.get(name)
        if not s:
            return ()
        out = []
        ent = s[9] or (24 if name.startswith('.rela') else 16)
        for i in range(s[5] // ent):
            off, info = struct.unpack_from('<QQ', elf, s[4] + i * ent)
            add = struct.unpack_from('<q', elf, s[4] + i * ent + 16)[0] if ent == 24 else 0
            sym = info >> 32
            out.append((off, info & 0xffffffff, syms[sym] if sym < len(syms) else sym, add))
        return tuple(out)

    ks = {}
    for s in secs:
        if s[0].startswith('.text.'):
            k = s[0][len('.text.'):]
            ks[k] = (('code', elf[s[4]:s[4] + s[5]]), ('flags', s[2]),
                     ('registers', s[7] >> 24),
                     ('relocations', relocs('.rel.text.' + k) + relocs('.rela.text.' + k)),
                     ('nv.info', body('.nv.info.' + k)),
                     ('shared', body('.nv.shared.' + k)),
                     ('constant0', body('.nv.constant0.' + k)))
    return ks


def ptx_entries(ptx, linkage):
    """name -> the text of each .entry, without line directives (nor its
    .visible unless linkage)."""
    out = {}
    text = ptx.decode(errors='replace').split('\n')
    i = 0
    while i < len(text):
        m = re.match(r'\s*(?:\.visible\s+|\.weak\s+)?\.entry\s+(\S+?)\s*\(', text[i])
        if not m:
            i += 1
            continue
        j = i
        while j < len(text) and text[j] != '}':
            j += 1
        body = [ln for ln in text[i:j + 1] if not re.match(r'\s*\.(loc|file)\b', ln)
                and not ln.lstrip().startswith('//')]
        if not linkage:
            body[0] = re.sub(r'^(\s*)\.visible\s+', r'\1', body[0])
        out[m.group(1)] = '\n'.join(body)
        i = j + 1
    return out


def device_code(root, tmp, linkage):
    """(what, sm, kernel) -> (object, compared tuple)."""
    out = {}
    for obj in objects(root):
        blob = section(obj, '.nv_fatbin', tmp)
        for kind, sm, data in fatbin_entries(blob):
            if kind == 2:
                items = cubin_kernels(data).items()
                what = 'sass'
            else:
                items = ptx_entries(data, linkage).items()
                what = 'ptx'
            for k, v in items:
                key = (what, sm, k)
                if key in out:
                    key = key + (os.path.relpath(obj, root),)
                out[key] = (os.path.relpath(obj, root), v)
    return out


ADDR = re.compile(r'^\s*[0-9a-f]+:\s*')
TARGET = re.compile(r'\b[0-9a-f]+ <')
POOL = re.compile(r'((?:\.rodata|\.LC|\.data|\.bss|\.text)[\w.]*)[+-]0x[0-9a-f]+')
LABEL = re.compile(r'\.LC\d+')
PAD = re.compile(r'^(?:(?:data16|cs|ds)\s+)*(?:nop\w*|xchg\s+%ax,%ax)\b')


def host_code(root, tmp):
    """function -> (object, normalised disassembly)."""
    funcs, seen = {}, {}
    for obj in objects(root):
        rel = os.path.relpath(obj, root)
        dis = subprocess.run(['objdump', '-dr', '--no-show-raw-insn', obj], check=True,
                             capture_output=True, text=True).stdout
        name, lines = None, []
        for ln in dis.split('\n') + ['Disassembly of section (end)']:
            m = re.match(r'^[0-9a-f]+ <(.+)>:$', ln)
            if m or ln.startswith('Disassembly of section'):
                while lines and PAD.match(lines[-1]):
                    lines.pop()  # the padding to the next function's alignment
                if name is not None:
                    seen.setdefault(name, []).append((rel, '\n'.join(lines)))
                name, lines = (m.group(1) if m else None), []
                continue
            if name is None or not ln.strip():
                continue
            ln = ADDR.sub('', ln)
            ln = TARGET.sub('<', ln)
            ln = POOL.sub(r'\1', ln)
            ln = LABEL.sub('.LC', ln)
            lines.append(ln.strip())
    for name, defs in seen.items():
        if len(defs) == 1:
            funcs[name] = defs[0]
        else:
            for rel, code in defs:
                funcs[name + ' [' + rel + ']'] = (rel, code)
    return funcs


def compare(a, b, label, also=()):
    same = diff = other = 0
    for k in sorted(set(a) | set(b), key=str):
        if k not in a:
            print(f'{label}: only after: {k} ({b[k][0]})')
        elif k not in b:
            print(f'{label}: only before: {k} ({a[k][0]})')
        elif a[k][1] == b[k][1]:
            same += 1
        elif any(k in x and x[k][1] == b[k][1] for x in also):
            same += 1
        elif any(k in x and x[k][1] != a[k][1] for x in also):
            other += 1
            print(f'{label}: varies between builds of before: {k} ({b[k][0]})')
        else:
            diff += 1
            what = ''
            if isinstance(a[k][1], tuple):
                what = ' (' + ', '.join(x[0] for x, y in zip(a[k][1], b[k][1]) if x != y) + ')'
            print(f'{label}: differs: {k} ({a[k][0]} -> {b[k][0]}){what}')
    only = len(set(a) ^ set(b))
    return same, diff, only, other


def main():
    args = sys.argv[1:]
    linkage, strict, also = True, False, []
    while '--also' in args:
        i = args.index('--also')
        also.append(args[i + 1])
        del args[i:i + 2]
    if '--ignore-linkage' in args:
        args.remove('--ignore-linkage')
        linkage = False
    if '--host-strict' in args:
        args.remove('--host-strict')
        strict = True
    if len(args) != 2:
        sys.exit(__doc__)
    before, after = args
    with tempfile.TemporaryDirectory() as tmp:
        da, db = device_code(before, tmp, linkage), device_code(after, tmp, linkage)
        dx = [device_code(d, tmp, linkage) for d in also]

        def only(d, what):
            return {k: v for k, v in d.items() if k[0] == what}
        sass = compare(only(da, 'sass'), only(db, 'sass'), 'sass', [only(d, 'sass') for d in dx])
        ptx = compare(only(da, 'ptx'), only(db, 'ptx'), 'ptx', [only(d, 'ptx') for d in dx])
        host = compare(host_code(before, tmp), host_code(after, tmp), 'host')
    for label, (same, diff, one, other) in (('sass kernels', sass), ('ptx entries', ptx),
                                            ('host functions', host)):
        print(f'{label}: {same + diff + other} compared, {same} identical, {diff} differ'
              + (f', {other} vary between builds of before' if also else '')
              + f', {one} on one side only')
    bad = sass[1] + sass[2] + ptx[1] + ptx[2] + (host[1] + host[2] if strict else 0)
    sys.exit(1 if bad else 0)


if __name__ == '__main__':
    main()
