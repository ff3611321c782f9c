// SPDX-License-Identifier: Apache-2.0
// Node.js under farmem (bench/RESULTS.md, session 29): objects and typed arrays rewritten at random; V8 puts
// the ArrayBuffers' bytes in glibc's heaps, which farmem pages as regions a handler thread serves.
//   node --max-old-space-size=4096 bench/progs/node_churn.js OBJECTS STEPS
// Big heap of objects and typed arrays, rewritten at random, every value checked at the end.
const N = +process.argv[2] || 2000000, STEPS = +process.argv[3] || 4000000;
function h(i, g) { let x = (i * 2654435761 + g * 40503) >>> 0; x ^= x >>> 13; x = Math.imul(x, 0x5bd1e995) >>> 0; return (x ^ (x >>> 15)) >>> 0; }
const objs = new Array(N), gen = new Uint32Array(N);
for (let i = 0; i < N; i++) objs[i] = { id: i, v: h(i, 0), s: "k" + h(i, 0).toString(36), a: new Float64Array(8).fill(h(i, 0)) };
const big = []; for (let k = 0; k < 64; k++) { const b = new Uint32Array(1 << 20); for (let j = 0; j < b.length; j++) b[j] = h(j, k); big.push(b); }
let r = 12345;
for (let t = 0; t < STEPS; t++) {
  r = (Math.imul(r, 1103515245) + 12345) >>> 0;
  const i = r % N, g = ++gen[i];
  objs[i] = { id: i, v: h(i, g), s: "k" + h(i, g).toString(36), a: new Float64Array(8).fill(h(i, g)) };
  const k = r % 64, j = (r >>> 6) % (1 << 20); big[k][j] = h(j, k) ^ g; big[k][j] = h(j, k);
}
let bad = 0;
for (let i = 0; i < N; i++) { const o = objs[i], w = h(i, gen[i]); if (o.id !== i || o.v !== w || o.s !== "k" + w.toString(36) || o.a[7] !== w) bad++; }
for (let k = 0; k < 64; k++) { const b = big[k]; for (let j = 0; j < b.length; j += 97) if (b[j] !== h(j, k)) bad++; }
console.log(`node: ${bad ? "BAD " + bad : "ok"} n=${N} steps=${STEPS} heapMB=${(process.memoryUsage().heapUsed/1048576)|0} rssMB=${(process.memoryUsage().rss/1048576)|0}`);
process.exit(bad ? 1 : 0);
