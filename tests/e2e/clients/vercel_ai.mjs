// The Vercel AI SDK through the proxy, on its default OpenAI provider: `openai(model)` is
// the Responses API. A long conversation with a planted fact, a tool the SDK runs itself
// and streamed turns; the session named in the body (providerOptions.openai.promptCacheKey
// is `prompt_cache_key`). Prints one JSON line for tests/e2e/test_clients.py.
// store left at its default (true): the SDK sends its earlier answers back as
// `item_reference` items, which the proxy reads as the output items it relayed.
// Usage: node vercel_ai.mjs <proxy base URL> <filler text>
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, jsonSchema, stepCountIs, streamText, tool } from "ai";

const [base, filler] = process.argv.slice(2);
const openai = createOpenAI({
  baseURL: `${base}/v1`,
  apiKey: "sk-vercel",
  headers: { "X-Sim-Context-Window": "4096" },
});
const model = openai("sim-4k");
const providerOptions = { openai: { promptCacheKey: "vercel" } };
const toolArgs = [];
const tools = {
  read_file: tool({
    description: "Read a file",
    inputSchema: jsonSchema({ type: "object", properties: { step: { type: "integer" } } }),
    execute: async (args) => {
      toolArgs.push(args);
      return "x ".repeat(300);
    },
  }),
};
const statuses = {};
const windows = new Set();
const afterTools = [];
const messages = [];
const system = "You are a helpful assistant.";

function note(steps) {
  for (const step of steps) {
    const headers = step.response.headers;
    statuses[headers["x-compaction-status"]] = (statuses[headers["x-compaction-status"]] || 0) + 1;
    windows.add(headers["x-context-window"]);
  }
}

for (let turn = 0; turn < 36; turn++) {
  const fact = turn === 0 ? " FACT code=k7q2" : "";
  const call = turn % 5 === 4 ? " CALL 1" : "";
  messages.push({ role: "user", content: `Turn ${turn}: ${filler}${fact}${call}` });
  if (turn % 3 === 1) {
    // Streamed turns carry no tools, as in the other clients' scenario.
    const result = streamText({ model, system, messages, providerOptions, maxRetries: 0 });
    let text = "";
    for await (const delta of result.textStream) text += delta;
    note(await result.steps);
    messages.push(...(await result.response).messages);
    continue;
  }
  const result = await generateText({
    model, system, messages, tools, providerOptions, maxRetries: 0, stopWhen: stepCountIs(3),
  });
  note(result.steps);
  if (result.steps.length > 1) afterTools.push(result.text);
  messages.push(...result.response.messages);
}
messages.push({ role: "user", content: "RECALL code" });
const recall = await generateText({ model, system, messages, providerOptions, maxRetries: 0 });
note(recall.steps);
console.log(JSON.stringify({
  recall: recall.text,
  statuses,
  windows: [...windows],
  toolArgs,
  afterTools,
}));
