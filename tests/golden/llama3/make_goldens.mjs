// tests/golden/llama3/make_goldens.mjs — golden ids for the Llama 3
// tokenizer and chat template, from implementations independent of llamad.
//
// Run by make.sh (which pins the npm packages); writes tokenize.json and
// chat.json next to this file. Arguments: the folder holding tokenizer.json
// and tokenizer_config.json, then the output folder.
//
// Reference: @huggingface/tokenizers (tokenizers.js), which rewrites the
// Oniguruma pre-tokenizer regex of the Rust `tokenizers` crate into an
// equivalent JavaScript one (\s as \p{White_Space}, (?i:...) ...). Cross
// check: @lenml/tokenizers (a fork of transformers.js' tokenizer classes).
// A case where the two disagree keeps the reference's ids and records the
// other's as "lenml_ids".
//
// tokenize.json: plain text, no BOS, special tokens NOT parsed out of the
// text. Both libraries always split added tokens out of text, so they are
// given the tokenizer.json with its added_tokens list emptied: what is left
// is exactly the pre-tokenizer + byte-level BPE over the 128,000 regular
// tokens (what the Rust crate does with encode_special_tokens = true).
//
// chat.json: the tokenizer_config.json chat_template rendered by
// @huggingface/jinja, then encoded with the full tokenizer.json (special
// tokens recognised), no BOS added by the encoder (the template has it).
// No message content holds a special token's text: the libraries would
// parse it as the special token, where llamad keeps client text plain.

import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Tokenizer } from '@huggingface/tokenizers';
import { TokenizerLoader } from '@lenml/tokenizers';
import { Template } from '@huggingface/jinja';

// Versions as installed beside this script (package.json is not exported).
const nodeModules = path.join(path.dirname(fileURLToPath(import.meta.url)), 'node_modules');
const ver = (p) => `${p}@${JSON.parse(fs.readFileSync(path.join(nodeModules, p, 'package.json'), 'utf8')).version}`;
const GENERATOR = [ver('@huggingface/tokenizers'), ver('@lenml/tokenizers'),
	ver('@huggingface/jinja'), `node@${process.versions.node}`].join(' ');

const [tokDir, outDir] = process.argv.slice(2);
if (!tokDir || !outDir) {
	console.error('usage: node make_goldens.mjs TOKENIZER_DIR OUT_DIR');
	process.exit(2);
}
const tj = JSON.parse(fs.readFileSync(path.join(tokDir, 'tokenizer.json'), 'utf8'));
const tc = JSON.parse(fs.readFileSync(path.join(tokDir, 'tokenizer_config.json'), 'utf8'));

function fail(msg) {
	console.error(`make_goldens: ${msg}`);
	process.exit(1);
}
const same = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);

const plainJson = { ...tj, added_tokens: [] };
const hfPlain = new Tokenizer(plainJson, tc);
const lenPlain = TokenizerLoader.fromPreTrained({ tokenizerJSON: plainJson, tokenizerConfig: tc });
const hfFull = new Tokenizer(tj, tc);
const lenFull = TokenizerLoader.fromPreTrained({ tokenizerJSON: tj, tokenizerConfig: tc });

const hfIds = (t, s) => Array.from(t.encode(s, { add_special_tokens: false }).ids);
const lenIds = (t, s) => Array.from(t.encode(s, { add_special_tokens: false }));

// Did we load the Llama 3 files? Ids published with the model.
for (const [s, want] of [['Hello world', [9906, 1917]], ['Hello World', [9906, 4435]]]) {
	const got = hfIds(hfPlain, s);
	if (!same(got, want))
		fail(`"${s}" gives [${got}], Llama 3 gives [${want}]: wrong tokenizer.json?`);
}
for (const [name, id] of [['<|begin_of_text|>', 128000], ['<|end_of_text|>', 128001],
	['<|start_header_id|>', 128006], ['<|end_header_id|>', 128007], ['<|eot_id|>', 128009]]) {
	const got = hfIds(hfFull, name);
	if (!same(got, [id]))
		fail(`${name} encodes to [${got}] with special tokens, not [${id}]`);
}

// ---------------------------------------------------------------- cases
const longParagraph = [
	'The lighthouse keeper had kept a log for thirty-one years, and in all that time he had never missed an entry.',
	'Each evening at dusk he climbed the ninety-seven iron steps, trimmed the wick, polished the great lens until it threw back his own tired face, and wrote three lines in a ledger bound in green cloth:',
	'the wind, the sea, and whatever ships had passed.',
	'Most nights the ships were few, a coaster heading north with timber, a trawler riding low with its catch, once in a long while a liner lit up like a small town drifting past the headland.',
	"He didn't think of himself as lonely; the gulls were company enough, and the radio brought him the weather and, on Sundays, a concert from the city that he listened to with his boots off and his feet on the stove's warm rail.",
	'In the spring of his last year the supply boat brought a letter from the authority that ran the lights.',
	'The station would be automated by autumn, it said, with a sensor to measure the fog and a motor to turn the lens, and a technician would visit twice a year.',
	'He read it twice, folded it along its creases, and put it in the back of the ledger, where it stayed through the long bright evenings of June and the first storms of September.',
	"When the technician finally came, a young woman with a laptop and a box of cables, she asked him what he'd miss the most.",
	'He thought about it while the kettle boiled.',
	'"Knowing," he said at last.',
	'"Knowing that if something went wrong out there, somebody was awake."',
	'She nodded as if that were a reasonable answer, and spent the afternoon on the gallery with her instruments, calibrating, testing, writing numbers into a spreadsheet that glowed blue in the failing light.',
	'That night, for the first time in thirty-one years, the lamp came on without him.',
	'He watched it from the doorway of the cottage below, the beam sweeping over the water in its patient circle, four seconds light and eight seconds dark, exactly as it always had.',
	'Then he went inside, opened the green ledger, and wrote the wind, the sea, and the ships, because someone ought to.',
].join(' ');
let long = longParagraph;
while (Buffer.byteLength(long) < 5000)
	long += '\n\n' + longParagraph.split(' ').reverse().join(' ');

const C_CODE = `#include <stdio.h>

static int sum(const int *a, size_t n)
{
	int s = 0;
	for (size_t i = 0; i < n; i++)
		s += a[i];  /* no overflow check */
	return s;
}

int main(void)
{
	int v[] = {1, 2, 3};
	printf("%d\\n", sum(v, 3));
	return 0;
}
`;
const PY_CODE = `def fib(n: int) -> int:
    """Return the n-th Fibonacci number."""
    if n < 2:
        return n
    a, b = 0, 1
    for _ in range(n - 1):
        a, b = b, a + b
    return b


if __name__ == "__main__":
    print([fib(i) for i in range(10)])
`;
const JSON_TEXT = `{"name": "llamad", "version": 3, "tags": ["c", "daemon"], "nested": {"ok": true, "ratio": 0.25, "none": null}}`;

const CASES = [
	['empty', ''],
	['hello_world', 'Hello world'],
	['hello_World', 'Hello World'],
	['prose_ascii', 'The quick brown fox jumps over the lazy dog. It barked, twice!'],
	['prose_punct', 'Wait... what?! (Really?) Yes; no: maybe -- "quoted" and \'single\'.'],
	['leading_space', ' leading space'],
	['code_c', C_CODE],
	['code_python', PY_CODE],
	['code_json', JSON_TEXT],
	['num_1', '1'],
	['num_12', '12'],
	['num_123', '123'],
	['num_1234', '1234'],
	['num_1234567', '1234567'],
	['num_pi', '3.14159'],
	['num_million', '1,000,000'],
	['num_in_text', 'In 2024 we sold 15000 units at $9.99 each (a 7% rise).'],
	['spaces_multiple', 'a  b   c    d'],
	['spaces_trailing', 'trailing spaces   '],
	['spaces_leading_run', '    four leading'],
	['spaces_before_newline', 'line one   \nline two'],
	['tabs', 'col1\tcol2\t\tcol3'],
	['tab_alone', '\t'],
	['space_alone', ' '],
	['newline_alone', '\n'],
	['newlines_three', '\n\n\n'],
	['newlines_in_text', 'first\nsecond\n\nthird\n'],
	['crlf', 'windows\r\nline\r\n'],
	['cr_alone', 'old\rmac'],
	['mixed_ws', ' \t \n \t\n  x'],
	['cjk_chinese', '我们今天去公园散步，天气非常好。'],
	['cjk_japanese', '東京は日本の首都です。ひらがなとカタカナ、漢字を使います。'],
	['cjk_korean', '안녕하세요, 만나서 반갑습니다. 한국어 문장입니다.'],
	['emoji_simple', 'I love pizza 🍕 and cats 🐱!'],
	['emoji_zwj', 'family: 👨‍👩‍👧‍👦 and technologist: 🧑🏽‍💻'],
	['emoji_flags', 'flags 🇫🇷🇯🇵🇺🇸 and 🏴‍☠️'],
	['emoji_skin_tone', '👍🏻👍🏿✌️'],
	['contraction_im', "I'm here"],
	['contraction_dont_upper', "DON'T STOP"],
	['contraction_youre_mixed', "you'RE right"],
	['contraction_its', "it's fine"],
	['contraction_hell_mixed', "He'LL go"],
	['contraction_many', "we've they'd she'll I'D WE'VE 'S 'sa"],
	['cyrillic', 'Привет, мир! Как дела?'],
	['greek', 'Καλημέρα κόσμε, τι κάνεις;'],
	['arabic', 'مرحبا بالعالم، كيف حالك؟'],
	['hindi', 'नमस्ते दुनिया, आप कैसे हैं?'],
	['thai', 'สวัสดีชาวโลก วันนี้อากาศดี'],
	['accented_latin', 'Café déjà vu, naïve façade, Zürich, São Paulo, Ångström, Łódź.'],
	['mixed_scripts', 'English, Русский, 中文, العربية, हिन्दी and ไทย in one line.'],
	['literal_eot', 'say <|eot_id|> now'],
	['literal_specials', '<|begin_of_text|><|start_header_id|>user<|end_header_id|>'],
	['control_chars', 'a\u0000b\u0001c\u0007d\u001b[31mred\u001b[0m\u007f'],
	['nbsp', 'non\u00a0breaking\u00a0\u00a0space'],
	['em_space', 'em\u2003space\u2003\u2003x'],
	['ideographic_space', '全角\u3000スペース\u3000\u3000x'],
	['nel_u0085', 'next\u0085line \u0085\u0085  x'],
	['bom_ufeff', '\ufeffbom\ufeff  x \ufeff\ufeff'],
	['mongolian_vowel_sep', 'a\u180e  b\u180e'],
	['line_para_sep', 'a\u2028b\u2029c'],
	// \s differs between engines: Oniguruma's (Rust) is White_Space, which
	// has U+0085 but not U+FEFF; JavaScript's \s is the other way round;
	// PCRE2's \h has U+180E (a format character since Unicode 6.3).
	['nel_space_letter', 'a \u0085b'],
	['bom_space_letter', 'a \ufeffb'],
	['mvs_space_letter', 'a \u180eb'],
	['long_paragraph', long],
];

const tokCases = [];
const disagreements = [];
for (const [name, text] of CASES) {
	const ids = hfIds(hfPlain, text);
	const dec = ids.length ? hfPlain.decode(ids, { clean_up_tokenization_spaces: false }) : "";
	if (dec !== text)
		fail(`${name}: reference decode does not give the text back`);
	const other = lenIds(lenPlain, text);
	const c = { name, text, ids };
	if (!same(ids, other)) {
		c.lenml_ids = other;
		disagreements.push(name);
	}
	tokCases.push(c);
}
if (tokCases.find((c) => c.name === 'literal_eot').ids.includes(128009))
	fail('literal_eot: <|eot_id|> was parsed as a special token');

// ---------------------------------------------------------------- chat
const BOS = tc.bos_token;
const template = new Template(tc.chat_template);
const CHATS = [
	['one_user', [{ role: 'user', content: 'Hello!' }]],
	['system_user', [
		{ role: 'system', content: 'You are a helpful assistant.' },
		{ role: 'user', content: 'What is the capital of France?' }]],
	['multi_turn', [
		{ role: 'system', content: 'You answer briefly.' },
		{ role: 'user', content: 'Name a prime number.' },
		{ role: 'assistant', content: 'Seven.' },
		{ role: 'user', content: 'Another one?' }]],
	['three_exchanges', [
		{ role: 'user', content: 'Hi, who are you?' },
		{ role: 'assistant', content: 'I am an assistant running on llamad.' },
		{ role: 'user', content: 'Can you count to three?' },
		{ role: 'assistant', content: 'One, two, three.' },
		{ role: 'user', content: 'And backwards?' },
		{ role: 'assistant', content: 'Three, two, one.' },
		{ role: 'user', content: 'Thanks.' }]],
	['whitespace_trimmed', [
		{ role: 'system', content: '   \n\tBe terse.  \n' },
		{ role: 'user', content: '\n\n  padded question?   \t\n' }]],
	['newlines_and_code', [
		{ role: 'user', content: 'Fix this:\n\n```c\nint main(void)\n{\n\treturn 0\n}\n```\nThanks!' },
		{ role: 'assistant', content: 'Add the semicolon:\n\n```c\n\treturn 0;\n```' },
		{ role: 'user', content: 'And in Python?\n' + PY_CODE }]],
	['non_ascii', [
		{ role: 'system', content: 'Réponds en français, s’il te plaît.' },
		{ role: 'user', content: '日本語で答えて 🙂 — Привет! مرحبا' }]],
];
const chatCases = [];
for (const [name, messages] of CHATS) {
	const rendered = template.render({ messages, bos_token: BOS, add_generation_prompt: true });
	// The template by hand, so a jinja misreading shows up here.
	let byHand = '';
	messages.forEach((m, i) => {
		byHand += (i === 0 ? BOS : '') + '<|start_header_id|>' + m.role +
			'<|end_header_id|>\n\n' + m.content.trim() + '<|eot_id|>';
	});
	byHand += '<|start_header_id|>assistant<|end_header_id|>\n\n';
	if (rendered !== byHand)
		fail(`chat ${name}: jinja rendered ${JSON.stringify(rendered)}, by hand ${JSON.stringify(byHand)}`);
	const ids = hfIds(hfFull, rendered);
	if (ids[0] !== 128000 || ids[1] === 128000)
		fail(`chat ${name}: expected exactly one leading BOS, got [${ids.slice(0, 3)}...]`);
	const other = lenIds(lenFull, rendered);
	const c = { name, messages, rendered, ids };
	if (!same(ids, other)) {
		c.lenml_ids = other;
		disagreements.push(`chat:${name}`);
	}
	chatCases.push(c);
}

const write = (file, obj) =>
	fs.writeFileSync(path.join(outDir, file), JSON.stringify(obj, null, 1) + '\n');
write('tokenize.json', { generator: GENERATOR, cases: tokCases });
write('chat.json', { generator: GENERATOR, bos_token: BOS, cases: chatCases });
console.log(`${tokCases.length} tokenize cases, ${chatCases.length} chat cases; ` +
	`lenml disagrees on ${disagreements.length}: ${disagreements.join(' ') || '-'}`);
