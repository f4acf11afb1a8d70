// The demo speaks the OpenAI Realtime protocol (GA event names) to /v1/realtime.
const $ = (id) => document.getElementById(id);
const RATE = 24000;

const state = {
  ws: null, audio: null, player: null, mic: null, cameraTimer: null,
  userLine: null, assistantLine: null, turn: 0,
  speechStoppedAt: null, responseStartedAt: null, firstAudioAt: null, firstTextAt: null,
};
window.demo = state; // exposed for automated end-to-end tests

function setStatus(text, kind = "") {
  const el = $("status");
  el.textContent = text;
  el.className = `status ${kind}`;
}

function addLine(role, text = "") {
  const el = document.createElement("div");
  el.className = `msg ${role}`;
  el.textContent = text;
  $("log").appendChild(el);
  $("log").scrollTop = $("log").scrollHeight;
  return el;
}

function send(event) {
  if (state.ws && state.ws.readyState === WebSocket.OPEN) state.ws.send(JSON.stringify(event));
}

function b64FromBuffer(buffer) {
  const bytes = new Uint8Array(buffer);
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

function floatFromB64Pcm16(b64) {
  const bin = atob(b64);
  const out = new Float32Array(bin.length >> 1);
  for (let i = 0; i < out.length; i++) {
    let v = bin.charCodeAt(2 * i) | (bin.charCodeAt(2 * i + 1) << 8);
    if (v >= 0x8000) v -= 0x10000;
    out[i] = v / 0x8000;
  }
  return out;
}

async function ensureAudio() {
  if (state.audio) return;
  state.audio = new AudioContext({ sampleRate: RATE });
  await state.audio.audioWorklet.addModule("worklets.js");
  state.player = new AudioWorkletNode(state.audio, "playback-processor");
  state.player.connect(state.audio.destination);
}

function recordLatency() {
  const row = document.createElement("tr");
  const fmt = (a, b) => (a && b ? `${Math.round(b - a)} ms` : "–");
  const start = state.speechStoppedAt || state.responseStartedAt;
  row.innerHTML = `<td>${state.turn}</td><td>${fmt(start, state.firstAudioAt)}</td><td>${fmt(start, state.firstTextAt)}</td>`;
  $("latency").querySelector("tbody").appendChild(row);
}

function handle(event) {
  switch (event.type) {
    case "session.created":
      setStatus(`connected · ${event.session.model || "model"}`, "live");
      break;
    case "input_audio_buffer.speech_started":
      state.player && state.player.port.postMessage("clear"); // barge-in: stop talking
      state.userLine = addLine("user", "…");
      break;
    case "input_audio_buffer.speech_stopped":
      state.speechStoppedAt = performance.now();
      break;
    case "conversation.item.input_audio_transcription.completed":
      (state.userLine || addLine("user")).textContent = event.transcript;
      state.userLine = null;
      break;
    case "response.created":
      state.turn += 1;
      state.responseStartedAt = performance.now();
      state.firstAudioAt = state.firstTextAt = null;
      state.assistantLine = addLine("assistant");
      break;
    case "response.output_audio_transcript.delta":
    case "response.output_text.delta":
      if (!state.firstTextAt) state.firstTextAt = performance.now();
      state.assistantLine.textContent += event.delta;
      break;
    case "response.output_audio.delta":
      if (!state.firstAudioAt) state.firstAudioAt = performance.now();
      state.player.port.postMessage(floatFromB64Pcm16(event.delta).buffer, []);
      break;
    case "response.image_generation_call.partial_image":
      showImage(event.item_id, event.partial_image_b64);
      break;
    case "response.output_item.done":
      if (event.item.type === "image_generation_call" && event.item.result) showImage(event.item.id, event.item.result);
      break;
    case "response.done":
      recordLatency();
      state.speechStoppedAt = null;
      if (event.response.status === "failed") addLine("system", JSON.stringify(event.response.status_details));
      break;
    case "error":
      addLine("system", `${event.error.code || event.error.type}: ${event.error.message}`);
      break;
  }
}

function showImage(itemId, b64) {
  let img = document.querySelector(`img[data-item="${itemId}"]`);
  if (!img) {
    img = document.createElement("img");
    img.dataset.item = itemId;
    $("images").prepend(img);
  }
  img.src = `data:image/png;base64,${b64}`;
}

async function connect() {
  await ensureAudio();
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const key = $("api-key").value.trim();
  const protocols = ["realtime"].concat(key ? [`openai-insecure-api-key.${key}`] : []);
  const ws = new WebSocket(`${scheme}://${location.host}/v1/realtime`, protocols);
  state.ws = ws;
  setStatus("connecting…");
  ws.onmessage = (m) => handle(JSON.parse(m.data));
  ws.onclose = (e) => { setStatus(`closed (${e.code})`, e.code === 1000 ? "" : "error"); toggleInputs(false); };
  ws.onopen = () => {
    send({
      type: "session.update",
      session: {
        type: "realtime",
        output_modalities: ["audio"],
        audio: {
          input: {
            format: { type: "audio/pcm", rate: RATE },
            transcription: { model: "whisper-1" },
            turn_detection: { type: "server_vad", threshold: 0.5, prefix_padding_ms: 300, silence_duration_ms: 500 },
          },
          output: { format: { type: "audio/pcm", rate: RATE } },
        },
      },
    });
    toggleInputs(true);
  };
}

function toggleInputs(on) {
  for (const id of ["mic", "text", "send", "webcam", "image-out"]) $(id).disabled = !on;
  $("connect").textContent = on ? "Disconnect" : "Connect";
}

async function toggleMic() {
  if (state.mic) {
    state.mic.stream.getTracks().forEach((t) => t.stop());
    state.mic.node.disconnect();
    state.mic = null;
    $("mic").textContent = "Start microphone";
    return;
  }
  const stream = await navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true },
  });
  const source = state.audio.createMediaStreamSource(stream);
  const node = new AudioWorkletNode(state.audio, "capture-processor");
  node.port.onmessage = (e) => send({ type: "input_audio_buffer.append", audio: b64FromBuffer(e.data) });
  source.connect(node);
  state.mic = { stream, node };
  $("mic").textContent = "Stop microphone";
}

async function toggleCamera() {
  if (!$("webcam").checked) {
    clearInterval(state.cameraTimer);
    const video = $("camera");
    if (video.srcObject) video.srcObject.getTracks().forEach((t) => t.stop());
    video.srcObject = null;
    video.hidden = true;
    return;
  }
  const video = $("camera");
  video.srcObject = await navigator.mediaDevices.getUserMedia({ video: { width: 640, height: 480 } });
  video.hidden = false;
  const canvas = document.createElement("canvas");
  state.cameraTimer = setInterval(() => {
    if (!video.videoWidth) return;
    canvas.width = video.videoWidth;
    canvas.height = video.videoHeight;
    canvas.getContext("2d").drawImage(video, 0, 0);
    send({
      type: "conversation.item.create",
      item: { type: "message", role: "user", content: [{ type: "input_image", image_url: canvas.toDataURL("image/jpeg", 0.7) }] },
    });
  }, 1000);
}

$("connect").onclick = () => (state.ws && state.ws.readyState <= 1 ? state.ws.close(1000) : connect());
$("mic").onclick = toggleMic;
$("webcam").onchange = toggleCamera;
$("text-form").onsubmit = (e) => {
  e.preventDefault();
  const text = $("text").value.trim();
  if (!text) return;
  $("text").value = "";
  addLine("user", text);
  send({ type: "conversation.item.create", item: { type: "message", role: "user", content: [{ type: "input_text", text }] } });
  const modalities = $("image-out").checked ? ["image"] : ["audio"];
  send({ type: "response.create", response: { output_modalities: modalities } });
};
