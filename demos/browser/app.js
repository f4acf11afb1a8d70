// The demo speaks the OpenAI Realtime protocol (GA event names), over WebRTC by default or over the
// /v1/realtime WebSocket (transport.js).
import { b64FromBuffer, floatFromB64Pcm16, peak } from "./pcm.js";
import { openWebRtc, openWebSocket, Refused } from "./transport.js";

const $ = (id) => document.getElementById(id);
const RATE = 24000;
const KEPT_FRAMES = 2;
const LOUD = 0x8000 / 50; // -34 dBFS: a chunk this loud holds speech, even from a quiet microphone // the server shows the model only the most recent webcam frames; older ones are deleted

const SESSION = {
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
};

const state = {
  link: null, audio: null, player: null, mic: null, cameraTimer: null,
  // WebRTC: the microphone stream (its track is sent muted until the microphone is started), when the
  // answer's track started playing, and the latency row whose answer length it fills in once played.
  rtcStream: null, playStartedAt: null, lastRow: null, lastRowStart: null,
  userLines: new Map(), assistantLine: null, turn: 0, lastError: "",
  frameIds: [], frameCount: 0,
  speechStoppedAt: null, responseStartedAt: null, firstAudioAt: null, firstTextAt: null, turnAudioBytes: 0,
  // The turn's stages: how long after the speech ended the page heard speech_stopped (on the input stream's
  // own clock: the audio sent by then, minus where the last loud 100 ms chunk the page sent ends), and when
  // the final transcript came.
  lastLoudMs: 0, vadEndMs: null, transcriptAt: null, partials: new Map(),
  // Running totals, read by the end-to-end test and handy in the console.
  micBytesSent: 0, audioBytesReceived: 0, responsesDone: 0, transcripts: [], answers: [],
};
window.demo = state;

function setStatus(text, kind = "") {
  const el = $("status");
  el.textContent = text;
  el.className = `status ${kind}`;
}

function setPhase(text) {
  $("phase").textContent = text;
}

function addLine(role, text = "") {
  const el = document.createElement("div");
  el.className = `msg ${role}`;
  el.textContent = text;
  $("log").appendChild(el);
  $("log").scrollTop = $("log").scrollHeight;
  return el;
}

function showError(text) {
  if (text === state.lastError) return; // a failed response is reported by both `error` and `response.done`
  state.lastError = text;
  addLine("system", text);
}

function send(event) {
  if (state.link) state.link.send(event);
}

async function ensureAudio() {
  if (state.audio) return;
  state.audio = new AudioContext({ sampleRate: RATE });
  await state.audio.audioWorklet.addModule("worklets.js");
  state.player = new AudioWorkletNode(state.audio, "playback-processor");
  state.player.port.onmessage = (e) => {
    if (e.data === "started") setPhase("speaking");
    else if (e.data === "stopped") setPhase(state.mic ? "listening" : "");
  };
  state.player.connect(state.audio.destination);
}

function recordLatency(status) {
  // Stages from the end of speech as this page sees it (speech_stopped, or the request when typed):
  // VAD end, transcript, first text, first audio; then the answer's length.
  const row = document.createElement("tr");
  const fmt = (a, b) => (a && b ? `${Math.round(b - a)} ms` : "–");
  const start = state.speechStoppedAt || state.responseStartedAt;
  const vad = state.speechStoppedAt && state.vadEndMs !== null ? `${Math.round(state.vadEndMs)} ms` : "–";
  const transcript = state.speechStoppedAt ? fmt(start, state.transcriptAt) : "–";
  const seconds = status === "completed" ? `${(state.turnAudioBytes / 2 / RATE).toFixed(1)} s` : status;
  row.innerHTML = `<td>${state.turn}</td><td>${vad}</td><td>${transcript}</td><td>${fmt(start, state.firstTextAt)}</td>`
    + `<td>${fmt(start, state.firstAudioAt)}</td><td>${seconds}</td>`;
  $("latency").querySelector("tbody").appendChild(row);
  state.lastRow = row;
  // WebRTC: a short answer can be generated whole before its track starts playing; its first audio then
  // comes after response.done and fills this cell (output_audio_buffer.started).
  state.lastRowStart = state.firstAudioAt ? null : start;
}

function fillLateFirstAudio() {
  if (!state.lastRow || state.lastRowStart === null) return;
  state.lastRow.children[4].textContent = `${Math.round(state.firstAudioAt - state.lastRowStart)} ms`;
  state.lastRowStart = null;
}

function userLine(itemId) {
  let el = state.userLines.get(itemId);
  if (!el) {
    el = addLine("user", "…");
    state.userLines.set(itemId, el);
  }
  return el;
}

function handle(event) {
  switch (event.type) {
    case "session.created":
      setStatus(`connected · ${event.session.model || "model"}`, "live");
      break;
    case "input_audio_buffer.speech_started":
      if (state.player) state.player.port.postMessage("clear"); // barge-in: stop talking
      userLine(event.item_id);
      setPhase("hearing you");
      break;
    case "input_audio_buffer.speech_stopped":
      state.speechStoppedAt = performance.now();
      state.vadEndMs = state.micBytesSent / 2 / (RATE / 1000) - state.lastLoudMs;
      state.transcriptAt = null;
      setPhase("thinking");
      break;
    case "conversation.item.input_audio_transcription.delta": {
      // the words heard so far, while the user still speaks
      const heard = (state.partials.get(event.item_id) || "") + event.delta;
      state.partials.set(event.item_id, heard);
      userLine(event.item_id).textContent = `${heard} …`;
      break;
    }
    case "conversation.item.input_audio_transcription.completed":
      if (state.speechStoppedAt && !state.transcriptAt) state.transcriptAt = performance.now();
      userLine(event.item_id).textContent = event.transcript;
      state.userLines.delete(event.item_id);
      state.partials.delete(event.item_id);
      state.transcripts.push(event.transcript);
      break;
    case "conversation.item.input_audio_transcription.failed":
      userLine(event.item_id).textContent = "(speech not transcribed)";
      state.userLines.delete(event.item_id);
      state.partials.delete(event.item_id);
      break;
    case "response.created":
      state.turn += 1;
      state.responseStartedAt = performance.now();
      state.firstAudioAt = state.firstTextAt = null;
      state.lastRowStart = null; // a late first audio from here on is this response's
      state.turnAudioBytes = 0;
      state.assistantLine = addLine("assistant");
      break;
    case "response.output_audio_transcript.delta":
    case "response.output_text.delta":
      if (!state.firstTextAt) state.firstTextAt = performance.now();
      state.assistantLine.textContent += event.delta;
      break;
    case "response.output_audio.delta": {
      if (!state.firstAudioAt) state.firstAudioAt = performance.now();
      const samples = floatFromB64Pcm16(event.delta);
      state.audioBytesReceived += samples.length * 2;
      state.turnAudioBytes += samples.length * 2;
      state.player.port.postMessage(samples.buffer, [samples.buffer]);
      break;
    }
    case "output_audio_buffer.started": // WebRTC: the answer's track started playing
      if (!state.firstAudioAt) {
        state.firstAudioAt = performance.now();
        fillLateFirstAudio();
      }
      state.playStartedAt = performance.now();
      setPhase("speaking");
      break;
    case "output_audio_buffer.stopped":
    case "output_audio_buffer.cleared":
      onPlayed(event.type === "output_audio_buffer.cleared");
      break;
    case "response.image_generation_call.partial_image":
      showImage(event.item_id, event.partial_image_b64);
      break;
    case "response.output_item.done":
      if (event.item.type === "image_generation_call" && event.item.result) showImage(event.item.id, event.item.result);
      break;
    case "response.done":
      onResponseDone(event.response);
      break;
    case "error":
      showError(`${event.error.code || event.error.type}: ${event.error.message}`);
      if (event.error.param && event.error.param.endsWith("output_modalities")) $("image-out").checked = false;
      break;
  }
}

function onPlayed(cut) {
  // WebRTC plays the answer on its own clock: its length is known once it stopped playing.
  if (state.playStartedAt === null) return;
  const bytes = Math.round(((performance.now() - state.playStartedAt) / 1000) * RATE) * 2;
  state.playStartedAt = null;
  state.audioBytesReceived += bytes;
  if (state.lastRow) state.lastRow.lastChild.textContent = cut ? "interrupted" : `${(bytes / 2 / RATE).toFixed(1)} s`;
  setPhase(state.mic ? "listening" : "");
}

function onResponseDone(response) {
  recordLatency(response.status);
  state.responsesDone += 1;
  state.speechStoppedAt = null;
  if (state.assistantLine) {
    if (!state.assistantLine.textContent) state.assistantLine.remove();
    else state.answers.push(state.assistantLine.textContent);
  }
  if (!state.firstAudioAt) setPhase(state.mic ? "listening" : "");
  if (response.status !== "failed") return;
  const error = (response.status_details && response.status_details.error) || {};
  showError(`${error.code || "failed"}: ${error.message || JSON.stringify(response.status_details)}`);
  if (error.code === "unsupported_modality" && state.frameIds.length) {
    // A model without image input: stop the camera and take its frames out of the conversation,
    // or every later turn would fail the same way.
    $("webcam").checked = false;
    stopCamera();
    for (const id of state.frameIds.splice(0)) send({ type: "conversation.item.delete", item_id: id });
    addLine("system", "This model has no image input: webcam frames stopped and removed.");
  }
}

function showImage(itemId, b64) {
  let img = document.querySelector(`img[data-item="${itemId}"]`);
  if (!img) {
    img = document.createElement("img");
    img.dataset.item = itemId;
    img.alt = "generated image";
    $("images").prepend(img);
  }
  img.src = `data:image/png;base64,${b64}`;
}

function onClosed(text, failed) {
  state.link = null;
  setStatus(text, failed ? "error" : "");
  if (state.mic) stopMic();
  if (state.rtcStream) state.rtcStream.getTracks().forEach((t) => t.stop());
  state.rtcStream = null;
  $("webcam").checked = false;
  stopCamera();
  toggleInputs(false);
  setPhase("");
}

async function connect() {
  await ensureAudio();
  const key = $("api-key").value.trim();
  setStatus("connecting…");
  if ($("transport").value === "websocket") {
    state.link = openWebSocket({
      key,
      onEvent: handle,
      onOpen: () => {
        send({ type: "session.update", session: SESSION });
        toggleInputs(true);
      },
      onClose: (code) => {
        // 1006 before any session: the handshake was refused, most often for a missing or wrong key.
        const hint = code === 1006 && !$("status").classList.contains("live") ? " · check the API key" : "";
        onClosed(`closed (${code})${hint}`, code !== 1000);
      },
    });
    return;
  }
  try {
    // The microphone's track is in the call from the start, muted until "Start microphone".
    state.rtcStream = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true },
    });
    const micTrack = state.rtcStream.getAudioTracks()[0];
    micTrack.enabled = false;
    state.link = await openWebRtc({
      key,
      session: SESSION,
      micTrack,
      audioEl: $("remote-audio"),
      onEvent: handle,
      onClose: (reason) => onClosed(`closed (${reason})`, reason !== "hung up"),
    });
    toggleInputs(true);
  } catch (err) {
    const hint = err instanceof Refused && err.status === 401 ? " · check the API key" : "";
    onClosed(`refused: ${err.message}${hint}`, true);
  }
}

function toggleInputs(on) {
  for (const id of ["mic", "text", "send", "webcam", "image-out"]) $(id).disabled = !on;
  $("connect").textContent = on ? "Disconnect" : "Connect";
}

function stopMic() {
  if (state.mic.stream === state.rtcStream) state.mic.stream.getAudioTracks()[0].enabled = false;
  else state.mic.stream.getTracks().forEach((t) => t.stop());
  state.mic.node.disconnect();
  state.mic = null;
  $("mic").textContent = "Start microphone";
  $("mic").classList.remove("on");
  setPhase("");
}

async function toggleMic() {
  if (state.mic) {
    stopMic();
    return;
  }
  await state.audio.resume(); // contexts made before a user gesture start suspended
  // Over WebRTC the track carries the audio and the capture worklet only meters it, for the VAD stage's timing.
  const rtc = state.link && state.link.kind === "webrtc";
  const stream = rtc
    ? state.rtcStream
    : await navigator.mediaDevices.getUserMedia({
        audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true },
      });
  if (rtc) stream.getAudioTracks()[0].enabled = true;
  const source = state.audio.createMediaStreamSource(stream);
  const node = new AudioWorkletNode(state.audio, "capture-processor");
  node.port.onmessage = (e) => {
    state.micBytesSent += e.data.byteLength;
    if (peak(new Int16Array(e.data)) > LOUD) state.lastLoudMs = state.micBytesSent / 2 / (RATE / 1000);
    if (!rtc) send({ type: "input_audio_buffer.append", audio: b64FromBuffer(e.data) });
  };
  source.connect(node);
  state.mic = { stream, node };
  $("mic").textContent = "Stop microphone";
  $("mic").classList.add("on");
  setPhase("listening");
}

function stopCamera() {
  clearInterval(state.cameraTimer);
  state.cameraTimer = null;
  const video = $("camera");
  if (video.srcObject) video.srcObject.getTracks().forEach((t) => t.stop());
  video.srcObject = null;
  video.hidden = true;
}

function sendFrame(video, canvas) {
  if (!video.videoWidth) return;
  canvas.width = video.videoWidth;
  canvas.height = video.videoHeight;
  canvas.getContext("2d").drawImage(video, 0, 0);
  const id = `frame_${Date.now().toString(36)}_${state.frameCount++}`;
  send({
    type: "conversation.item.create",
    item: { id, type: "message", role: "user", content: [{ type: "input_image", image_url: canvas.toDataURL("image/jpeg", 0.7) }] },
  });
  state.frameIds.push(id);
  while (state.frameIds.length > KEPT_FRAMES) send({ type: "conversation.item.delete", item_id: state.frameIds.shift() });
}

async function toggleCamera() {
  if (!$("webcam").checked) {
    stopCamera();
    return;
  }
  const video = $("camera");
  try {
    video.srcObject = await navigator.mediaDevices.getUserMedia({ video: { width: 640, height: 480 } });
  } catch (err) {
    $("webcam").checked = false;
    showError(`webcam: ${err.message}`);
    return;
  }
  video.hidden = false;
  const canvas = document.createElement("canvas");
  state.cameraTimer = setInterval(() => sendFrame(video, canvas), 1000);
}

$("connect").onclick = () => (state.link && state.link.open() ? state.link.close() : connect());
const asked = new URLSearchParams(location.search).get("transport");
if (asked === "websocket" || asked === "webrtc") $("transport").value = asked;
$("mic").onclick = () => toggleMic().catch((err) => showError(`microphone: ${err.message}`));
$("webcam").onchange = toggleCamera;
$("text-form").onsubmit = (e) => {
  e.preventDefault();
  const text = $("text").value.trim();
  if (!text) return;
  $("text").value = "";
  addLine("user", text);
  send({ type: "conversation.item.create", item: { type: "message", role: "user", content: [{ type: "input_text", text }] } });
  const response = $("image-out").checked
    ? { output_modalities: ["image"], image: { partial_images: 2 } }
    : { output_modalities: ["audio"] };
  send({ type: "response.create", response });
};
