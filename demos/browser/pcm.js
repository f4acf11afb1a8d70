// pcm16 as the WebSocket transport carries it: base64 in events, Float32 for the playback worklet.

export function peak(samples) {
  let most = 0;
  for (const v of samples) most = Math.max(most, Math.abs(v));
  return most;
}

export function b64FromBuffer(buffer) {
  const bytes = new Uint8Array(buffer);
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

export function floatFromB64Pcm16(b64) {
  const bin = atob(b64);
  const out = new Float32Array(bin.length >> 1);
  for (let i = 0; i < out.length; i++) {
    let v = bin.charCodeAt(2 * i) | (bin.charCodeAt(2 * i + 1) << 8);
    if (v >= 0x8000) v -= 0x10000;
    out[i] = v / 0x8000;
  }
  return out;
}
