#!/usr/bin/env python3
"""tests/tools/editor_schemas.py PROTO LUA EL — the editor packages' hand
written protobuf schemas against proto/llamad.proto: every field the Neovim
codec (client/nvim/lua/llamad/pb.lua, `defs`) or the Emacs one
(client/emacs/llamad-proto.el, `llamad-proto-schemas`) knows must have the
.proto's number, name, type (an enum type reads as "enum") and repeatedness;
every message they know must have every field of the .proto's message (a
field added to the .proto is added to both codecs), except the members of a
oneof (Request.op, Response.body: an editor knows the operations it uses);
every enum value they name must be the .proto's value of that number (the
editors may drop the prefix or lower the case: EOS for STOP_EOS). Prints one
line per mismatch and exits 1, else a summary and 0."""
import re
import sys


def proto_enums(text):
    out = {}
    for m in re.finditer(r'^enum\s+(\w+)\s*\{(.*?)^\}', text, re.M | re.S):
        body = re.sub(r'//[^\n]*', '', m.group(2))
        out[m.group(1)] = {int(n): name for name, n in re.findall(r'(\w+)\s*=\s*(\d+)', body)}
    return out


def lua_enums(text):
    out = {}
    for m in re.finditer(r'^M\.(\w+) = \{(.*?)\}', text, re.M | re.S):
        vals, pos = {}, 1
        for key, name in re.findall(r"(?:\[(\d+)\]\s*=\s*)?'(\w+)'", m.group(2)):
            if key:
                vals[int(key)] = name
            else:
                vals[pos] = name
                pos += 1
        out[m.group(1)] = vals
    return out


def el_enums(text):
    start = text.index('(defconst llamad-proto-enums')
    body = text[start:text.index('\n(def', start + 1)]
    return {m.group(1): {int(n): name for n, name in re.findall(r'\((\d+) \. "(\w+)"\)', m.group(2))}
            for m in re.finditer(r'\(([A-Z]\w*)((?:\s*\(\d+ \. "\w+"\))+)\)', body)}


def check_enums(label, enums, proto):
    bad = n = 0
    for enum, vals in enums.items():
        for num, name in vals.items():
            n += 1
            want = proto.get(enum, {}).get(num)
            if not want or not want.upper().endswith(name.upper()):
                print(f'{label}: {enum} value {num} is {name}, the .proto says {want}')
                bad += 1
    return bad, n


FIELD = r'(optional|repeated|required)?\s*([\w.]+)\s+(\w+)\s*=\s*(\d+)'


def proto_fields(text):
    """{message: {number: (name, type, repeated)}}, and {message: the
    numbers of its oneof members}"""
    enums = set(re.findall(r'^\s*enum\s+(\w+)', text, re.M))
    msgs, oneofs = {}, {}
    for m in re.finditer(r'^message\s+(\w+)\s*\{(.*?)^\}', text, re.M | re.S):
        fields = {}
        body = re.sub(r'//[^\n]*', '', m.group(2))
        for f in re.finditer(FIELD, body):
            label, typ, name, num = f.groups()
            if typ in ('oneof', 'message', 'enum'):
                continue
            fields[int(num)] = (name, 'enum' if typ in enums else typ, label == 'repeated')
        msgs[m.group(1)] = fields
        oneofs[m.group(1)] = {int(f.group(4)) for o in re.finditer(r'\boneof\s+\w+\s*\{(.*?)\}', body, re.S)
                              for f in re.finditer(FIELD, o.group(1))}
    return msgs, oneofs


def lua_fields(text):
    body = text[text.index('local defs = {'):]
    body = body[:body.index('\n}\n')]
    out = {}
    for m in re.finditer(r'^\s*(\w+)\s*=\s*\{(.*?)\},?\s*$(?=\n\s*\w+\s*=|\Z)', body, re.M | re.S):
        fields = []
        for f in re.finditer(r"\{\s*(\d+)\s*,\s*'(\w+)'\s*,\s*'(\w+)'\s*(,\s*'repeated'\s*)?\}", m.group(2)):
            fields.append((int(f.group(1)), f.group(2), f.group(3), bool(f.group(4))))
        out[m.group(1)] = fields
    return out


def el_fields(text):
    start = text.index('(defconst llamad-proto-schemas')
    body = text[start:text.index('\n(def', start + 1)]
    out = {}
    # (label `packed': a packed repeated scalar)
    for m in re.finditer(r'\(([A-Z]\w*)((?:\s*\(\d+ :[\w-]+ \w+(?: repeated| packed)?\))*)\)', body):
        fields = [(int(n), name.replace('-', '_'), typ, bool(rep))
                  for n, name, typ, rep in
                  re.findall(r'\((\d+) :([\w-]+) (\w+)( repeated| packed)?\)', m.group(2))]
        out[m.group(1)] = fields
    return out


def check(label, schemas, proto, oneofs):
    bad = n = 0
    for msg, fields in schemas.items():
        if msg not in proto:
            print(f'{label}: message {msg} is not in the .proto')
            bad += 1
            continue
        for num, name, typ, rep in fields:
            n += 1
            want = proto[msg].get(num)
            if want != (name, typ, rep):
                print(f'{label}: {msg} field {num} is {(name, typ, rep)}, the .proto says {want}')
                bad += 1
        known = {f[0] for f in fields}
        for num, (name, typ, rep) in sorted(proto[msg].items()):
            if num not in known and num not in oneofs[msg]:
                print(f'{label}: {msg} lacks field {num} ({name}, {typ}) of the .proto')
                bad += 1
    return bad, n, len(schemas)


def main():
    text = open(sys.argv[1]).read()
    (proto, oneofs), penums = proto_fields(text), proto_enums(text)
    bad = 0
    for label, path, parse, parse_enums in (('nvim', sys.argv[2], lua_fields, lua_enums),
                                            ('emacs', sys.argv[3], el_fields, el_enums)):
        src = open(path).read()
        schemas = parse(src)
        b, n, k = check(label, schemas, proto, oneofs)
        eb, en = check_enums(label, parse_enums(src), penums)
        if k < 10 or n < 40 or en < 20:
            print(f'{label}: only {k} messages, {n} fields and {en} enum values read from '
                  f'{path}: the parser missed them')
            b += 1
        bad += b + eb
        print(f'{label}: {k} messages, {n} fields, {en} enum values checked, {b + eb} mismatches')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
