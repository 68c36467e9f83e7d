// Flat config: typescript-eslint's recommended rules; formatting is prettier's job.
import js from '@eslint/js';
import prettier from 'eslint-config-prettier';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['**/lib/**', 'memviz/labextension/**', 'node_modules/**', 'ui-tests/**'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  prettier,
  {
    files: ['labextension/**/*.ts'],
    rules: {
      eqeqeq: ['error', 'always'],
      curly: ['error', 'all'],
      // Plan names are untrusted: build DOM with textContent, never from HTML strings.
      'no-restricted-syntax': [
        'error',
        {
          selector: "AssignmentExpression > MemberExpression.left[property.name=/^(innerHTML|outerHTML)$/]",
          message: 'plan names are untrusted: use textContent'
        },
        {
          selector: "CallExpression[callee.property.name='insertAdjacentHTML']",
          message: 'plan names are untrusted: use textContent'
        }
      ],
      '@typescript-eslint/no-unused-vars': ['error', { args: 'none' }]
    }
  },
  {
    files: ['labextension/webpack.config.js'],
    languageOptions: {
      sourceType: 'commonjs',
      globals: { module: 'writable', require: 'readonly', __dirname: 'readonly' }
    },
    rules: { '@typescript-eslint/no-require-imports': 'off' }
  }
);
