// The page's two ways to the Realtime API. Both hand every server event to onEvent and take client events in
// send(); they differ in how audio travels.
//  - WebRTC (the default): the API key mints a short-lived client secret (POST /v1/realtime/client_secrets),
//    which places the call (POST /v1/realtime/calls, SDP offer in, SDP answer out). The microphone is an
//    Opus track (with the browser's echo cancellation), the answer's audio a remote track played by an
//    <audio> element, and the events travel on the "oai-events" data channel. The server truncates an
//    interrupted answer to what it played.
//  - WebSocket: events, and the audio as base64 pcm16 in them, on /v1/realtime.

export class Refused extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function refusal(response) {
  let message = `${response.status}`;
  try {
    message = (await response.json()).error.message;
  } catch {
    // not OpenAI's error envelope: the status says enough
  }
  return new Refused(response.status, message);
}

function bearer(key) {
  return key ? { Authorization: `Bearer ${key}` } : {};
}

// Mints a client secret with the API key, as a web app's server would, so that the call carries only it.
async function clientSecret(key, session) {
  const response = await fetch("/v1/realtime/client_secrets", {
    method: "POST",
    headers: { "Content-Type": "application/json", ...bearer(key) },
    body: JSON.stringify({ expires_after: { anchor: "created_at", seconds: 600 }, session }),
  });
  if (!response.ok) throw await refusal(response);
  return (await response.json()).value;
}

// micTrack: the microphone's audio track (sent as Opus); audioEl: where the answer's audio plays.
export async function openWebRtc({ key, session, micTrack, audioEl, onEvent, onClose }) {
  const secret = await clientSecret(key, session);
  const pc = new RTCPeerConnection();
  pc.addTrack(micTrack);
  pc.ontrack = (e) => {
    audioEl.srcObject = e.streams[0] || new MediaStream([e.track]);
  };
  const channel = pc.createDataChannel("oai-events");
  channel.onmessage = (m) => onEvent(JSON.parse(m.data));
  let closed = false;
  const finish = (reason) => {
    if (closed) return;
    closed = true;
    pc.close();
    onClose(reason);
  };
  channel.onclose = () => finish("call ended");
  pc.onconnectionstatechange = () => {
    if (pc.connectionState === "failed") finish("ICE failed: no network path to the server");
  };
  await pc.setLocalDescription(await pc.createOffer());
  const response = await fetch("/v1/realtime/calls", {
    method: "POST",
    headers: { "Content-Type": "application/sdp", ...bearer(secret) },
    body: pc.localDescription.sdp,
  });
  if (!response.ok) {
    pc.close();
    throw await refusal(response);
  }
  const location = response.headers.get("Location");
  await pc.setRemoteDescription({ type: "answer", sdp: await response.text() });
  await new Promise((resolve, reject) => {
    channel.onopen = resolve;
    setTimeout(() => reject(new Error("the data channel did not open within 20 s")), 20000);
  });
  return {
    kind: "webrtc",
    open: () => !closed,
    send: (event) => channel.readyState === "open" && channel.send(JSON.stringify(event)),
    close: async () => {
      await fetch(`${location}/hangup`, { method: "POST", headers: bearer(secret) }).catch(() => {});
      finish("hung up");
    },
  };
}

export function openWebSocket({ key, onEvent, onOpen, onClose }) {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const protocols = ["realtime"].concat(key ? [`openai-insecure-api-key.${key}`] : []);
  const ws = new WebSocket(`${scheme}://${location.host}/v1/realtime`, protocols);
  ws.onmessage = (m) => onEvent(JSON.parse(m.data));
  ws.onclose = (e) => onClose(e.code);
  ws.onopen = onOpen;
  return {
    kind: "websocket",
    open: () => ws.readyState <= WebSocket.OPEN,
    send: (event) => ws.readyState === WebSocket.OPEN && ws.send(JSON.stringify(event)),
    close: async () => ws.close(1000),
  };
}
