// Bundles the extension with esbuild into dist/extension.js (vscode stays external).
import { mkdirSync } from "node:fs";
import * as esbuild from "esbuild";

const production = process.argv.includes("--production");
await esbuild.build({
  entryPoints: ["src/extension.ts"],
  bundle: true,
  outfile: "dist/extension.js",
  platform: "node",
  target: "node20",
  format: "cjs",
  external: ["vscode"],
  sourcemap: !production,
  minify: production,
  logLevel: "warning",
});

// `npm run package` writes the .vsix into build/, which vsce does not create: a fresh clone has none.
if (production) mkdirSync("build", { recursive: true });
