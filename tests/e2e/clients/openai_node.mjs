// openai-node through the proxy: a long conversation with a planted fact, a tool and
// streamed turns. Prints one JSON line for tests/e2e/test_clients.py to check.
// Usage: node openai_node.mjs <proxy base URL> <filler text>
import OpenAI from "openai";

const [base, filler] = process.argv.slice(2);
const client = new OpenAI({
  baseURL: `${base}/v1`,
  apiKey: "sk-node",
  maxRetries: 0,
  defaultHeaders: { "X-Sim-Context-Window": "4096", "X-Session-Id": "node" },
});
const tools = [{
  type: "function",
  function: {
    name: "read_file",
    description: "Read a file",
    parameters: { type: "object", properties: { step: { type: "integer" } } },
  },
}];
const statuses = {};
const windows = new Set();
const toolArgs = [];
const afterTools = [];
const history = [{ role: "system", content: "You are a helpful assistant." }];

function note(response) {
  const status = response.headers.get("x-compaction-status");
  statuses[status] = (statuses[status] || 0) + 1;
  windows.add(response.headers.get("x-context-window"));
}

for (let turn = 0; turn < 36; turn++) {
  const fact = turn === 0 ? " FACT code=k7q2" : "";
  const call = turn % 5 === 4 ? " CALL 1" : "";
  history.push({ role: "user", content: `Turn ${turn}: ${filler}${fact}${call}` });
  if (turn % 3 === 1) {
    const { data: stream, response } = await client.chat.completions
      .create({ model: "sim-4k", messages: history, tools, stream: true })
      .withResponse();
    note(response);
    let text = "";
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? "";
    history.push({ role: "assistant", content: text });
    continue;
  }
  const { data, response } = await client.chat.completions
    .create({ model: "sim-4k", messages: history, tools })
    .withResponse();
  note(response);
  const message = data.choices[0].message;
  history.push(message);
  for (const toolCall of message.tool_calls ?? []) {
    toolArgs.push(JSON.parse(toolCall.function.arguments));
    history.push({ role: "tool", tool_call_id: toolCall.id, content: "x ".repeat(300) });
  }
  if (message.tool_calls?.length) {
    const reply = await client.chat.completions.create({ model: "sim-4k", messages: history, tools });
    afterTools.push(reply.choices[0].message.content);
    history.push(reply.choices[0].message);
  }
}
history.push({ role: "user", content: "RECALL code" });
const recall = await client.chat.completions.create({ model: "sim-4k", messages: history });
console.log(JSON.stringify({
  recall: recall.choices[0].message.content,
  statuses,
  windows: [...windows],
  toolArgs,
  afterTools,
}));
